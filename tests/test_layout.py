"""The package's structure, checked from the source: role subpackages, no import cycles, no
import from a lower layer up to a higher one, the heavy engines only at the edges; and no test
module imported by another (what tests share lives in tests/helpers/ and tests/conftest.py)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PKG = REPO / "rft"

# Lowest first. A module may import its own layer and the layers below, never above; the role
# packages (explorer, trainer, convert) may not import each other.
LAYERS = [
    ("rft.errors", "rft.atomic"),
    (
        "rft.placement",
        "rft.rundir",
        "rft.lease",
        "rft.config.typed_dict",
        "rft.config.names",
        "rft.config.known_names",
    ),
    ("rft.config",),
    (
        "rft.data",
        "rft.models",
        "rft.safetensors_io",
        "rft.sync",
        "rft.monitor",
        "rft.entry",
        "rft.stages",
    ),
    ("rft.algo",),
    ("rft.buffer",),
    ("rft.workflow",),
    ("rft.explorer", "rft.trainer", "rft.convert", "rft.status", "rft.report"),
    ("rft.launch",),
    ("rft.devtools",),  # development model folders: nothing in the library imports them
]
ROLES = ("rft.explorer", "rft.trainer", "rft.convert")
ENGINE_IMPORTS = {"vllm": "rft.explorer.engine", "deepspeed": "rft.trainer.engine"}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST):
    """Every node, less the bodies of ``if TYPE_CHECKING:`` (annotations only, never run)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            continue
        yield node
        yield from _runtime_nodes(node)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports when it runs, at the top or inside a function."""
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}  # `from rft.x import module`
    return found


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PKG.rglob("*.py")}
    return {
        name: {m for m in imports(path) if m in files and m not in (name, "rft")}
        for name, path in files.items()
        if name != "rft"
    }


def layer(module: str) -> int:
    best = max(
        (
            (len(prefix), i)
            for i, group in enumerate(LAYERS)
            for prefix in group
            if module == prefix or module.startswith(prefix + ".")
        ),
        default=None,
    )
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best[1]


def test_roles_are_subpackages_and_the_top_holds_only_shared_modules():
    top = sorted(p.stem for p in PKG.glob("*.py"))
    assert top == [
        "__init__",
        "atomic",
        "data",
        "devtools",
        "entry",
        "errors",
        "lease",
        "models",
        "monitor",
        "placement",
        "report",
        "rundir",
        "safetensors_io",
        "stages",
        "status",
    ]
    assert sorted(p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__") == [
        "algo",
        "buffer",
        "config",
        "convert",
        "explorer",
        "launch",
        "sync",
        "trainer",
        "workflow",
    ]


def test_no_import_runs_up_a_layer_or_across_roles():
    bad = []
    for module, targets in graph().items():
        for target in targets:
            if target.startswith(module + "."):
                continue  # a package's own modules
            if layer(target) > layer(module):
                bad.append(
                    f"{module} -> {target} (layer {layer(module)} imports layer {layer(target)})"
                )
            role = next((r for r in ROLES if module.startswith(r)), None)
            other = next((r for r in ROLES if target.startswith(r)), None)
            if role and other and role != other:
                bad.append(f"{module} -> {target} (one role imports another)")
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                raise AssertionError(
                    "import cycle: " + " -> ".join(path[path.index(nxt) :] + [nxt])
                )
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])


def test_engines_are_imported_only_by_their_engine_module():
    for path in PKG.rglob("*.py"):
        for heavy, owner in ENGINE_IMPORTS.items():
            if any(m == heavy or m.startswith(heavy + ".") for m in imports(path)):
                assert module_name(path) == owner, f"{module_name(path)} imports {heavy}"


def test_light_modules_do_not_pull_in_vllm_or_deepspeed():
    """Importing anything but the trainer's engine and the modules that drive it (a step's plan,
    the policy's and the critic's updates, M2PO's mask) leaves both engines unloaded: the login
    node, preflight and the rewards stay fast."""
    heavy_users = {
        "rft.trainer.engine",
        "rft.trainer.step",
        "rft.trainer.plan",
        "rft.trainer.critic",
        "rft.trainer.m2po",
    }
    modules = sorted(m for m in graph() if m not in heavy_users and not m.endswith("__main__"))
    code = (
        f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
        "print(sorted(k for k in ('vllm', 'deepspeed') if k in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_tests_import_no_other_test_module():
    """What tests share lives in ``tests/helpers/`` (functions, constants) or ``tests/conftest.py``
    (fixtures): a test module that imports another couples to, and runs, all of that module."""
    bad = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module not in (None, "tests"):
                names = [node.module]  # from tests.test_x / test_x / .test_x import ...
            elif isinstance(node, ast.ImportFrom):
                names = [a.name for a in node.names]  # from tests / . import test_x
            else:
                continue
            for name in names:
                if re.fullmatch(r"(tests\.)?test_\w+(\.\w+)*", name):
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno} imports {name}")
    assert not bad, "move what they share to tests/helpers/ or tests/conftest.py:\n" + "\n".join(
        bad
    )
