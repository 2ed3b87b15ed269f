"""The README and docs/ stay true: their commands parse (and the configs they name load), the
repository paths, modules and tests they name exist, their links between pages resolve, and
docs/config-reference.md is what the schema generates now. Fast: one subprocess runs every
command up to its argument parsing (tests/helpers/doc_commands.py)."""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.helpers.doc_commands import MARKER

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Top-level folders of the repository: a code span or shell word starting with one is a path.
ROOTS = ("rft/", "bin/", "jobs/", "configs/", "data/", "env/", "tests/", "benchmarks/")
ROOTS += ("examples/", "docs/", ".ci/")
SHELL = ("bash", "sh", "shell", "console")
PYTHONS = ("python", "python3", ".venv/bin/python")
SEPARATORS = {";", "&&", "||", "|", "&"}
REDIRECTS = {">", ">>", "<", "2>", "2>&1"}
FENCE = re.compile(r"^\s*```(\w*)\s*$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")


def split_page(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(the page's prose with code blocks blanked out, [(language, block body)])."""
    prose, blocks, lang, body = [], [], None, []
    for line in text.splitlines():
        fence = FENCE.match(line)
        if fence and lang is None:
            lang, body = fence.group(1), []
        elif fence:
            blocks.append((lang, "\n".join(body)))
            lang = None
        elif lang is None:
            prose.append(line)
        else:
            body.append(line)
        if lang is not None or fence:
            prose.append("")
    return "\n".join(prose), blocks


def shell_commands(block: str) -> list[list[str]]:
    """Each simple command of a shell block as words (continuations joined, comments dropped,
    split at ; && || | &, cut at a redirection)."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
        lexer.whitespace_split, lexer.commenters = True, "#"
        words: list[str] = []
        redirected = False  # everything after a redirection is not an argument
        for word in [*lexer, ";"]:
            if word in SEPARATORS:
                if words:
                    commands.append(words)
                words, redirected = [], False
            elif word in REDIRECTS or redirected:
                redirected = True
            else:
                words.append(word)
    return [c for c in commands if c]


def entry_point(words: list[str]) -> dict | None:
    """``{"argv", "env"}`` when the command runs an rft program (bin/rft-*, python -m rft...,
    python -m benchmarks.<name>, python <repository script>.py), else None."""
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, value = words[0].split("=", 1)
        env[key], words = value, words[1:]
    if words and words[0] in PYTHONS:
        words = words[1:]
        if len(words) >= 2 and words[0] == "-m" and words[1].startswith(("rft", "benchmarks.")):
            return {"argv": words, "env": env}
        if words and words[0].endswith(".py") and (REPO / words[0]).is_file():
            return {"argv": words, "env": env}
    if words and words[0].startswith("bin/rft-"):
        return {"argv": words, "env": env}
    return None


def documented_commands() -> list[tuple[str, dict]]:
    found = []
    for page in PAGES:
        for lang, block in split_page(page.read_text())[1]:
            if lang in SHELL:
                for words in shell_commands(block):
                    command = entry_point(words)
                    if command:
                        found.append((page.relative_to(REPO).as_posix(), command))
    return found


def test_every_documented_rft_command_parses_and_its_config_loads():
    commands = documented_commands()
    programs = {c["argv"][0] if c["argv"][0] != "-m" else c["argv"][1] for _, c in commands}
    assert {"bin/rft-run", "bin/rft-launch", "bin/rft-status", "bin/rft-convert"} <= programs
    assert "bin/rft-debug" in programs and "benchmarks.quickstart_bench" in programs
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "helpers" / "doc_commands.py")],
        input=json.dumps([c for _, c in commands]),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    result = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    assert proc.returncode == 0 and result, proc.stderr[-2000:]
    problems = json.loads(result[-1][len(MARKER) :])
    assert not problems, "documented commands that fail:\n" + "\n".join(problems)


def test_entry_points_are_recognised_and_placeholders_are_not():
    block = (
        "bash env/setup.sh && .venv/bin/python bin/rft-run --config configs/x.yaml \\\n"
        "    a.b=1   # comment\n"
        "TRINITY_X=1 python -m rft.report RUN_DIR > out.txt; sbatch jobs/y.sbatch\n"
        "bin/rft-status RUN &\n"
    )
    commands = [entry_point(w) for w in shell_commands(block)]
    assert commands == [
        None,
        {"argv": ["bin/rft-run", "--config", "configs/x.yaml", "a.b=1"], "env": {}},
        {"argv": ["-m", "rft.report", "RUN_DIR"], "env": {"TRINITY_X": "1"}},
        None,
        {"argv": ["bin/rft-status", "RUN"], "env": {}},
    ]


def _words(page: Path) -> list[str]:
    """Code spans of the prose and words of shell blocks: where pages name paths and modules."""
    prose, blocks = split_page(page.read_text())
    words = [w for span in CODE_SPAN.findall(prose) for w in span.split()]
    for lang, block in blocks:
        if lang in SHELL:
            words += [w for command in shell_commands(block) for w in command]
    return [w.split("=", 1)[-1].rstrip(".,:;)'") for w in words]


def _module_names(path: Path) -> set[str]:
    """Names a module defines or imports at its top level."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def dotted_exists(name: str) -> bool:
    """``rft.a.b`` is a module, or a name defined in the longest module prefix of it."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:cut])
        module = (
            base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        )
        if module.is_file():
            rest = parts[cut:]
            return not rest or (len(rest) == 1 and rest[0] in _module_names(module))
    return False


def test_every_named_path_module_and_test_file_exists():
    missing = []
    for page in PAGES:
        for word in _words(page):
            if any(c in word for c in "<>*{}[]$") or "..." in word:
                continue  # a pattern or a placeholder, not a path
            if word.startswith(ROOTS) and not (REPO / word.split("::")[0]).exists():
                missing.append(f"{page.name}: {word}")
            elif re.fullmatch(r"rft(\.\w+)+", word) and not dotted_exists(word):
                missing.append(f"{page.name}: {word}")
            elif re.fullmatch(r"test_\w+\.py", word) and not (REPO / "tests" / word).is_file():
                missing.append(f"{page.name}: {word}")
    assert not missing, "named in the docs but absent:\n" + "\n".join(missing)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings (lowercase, punctuation dropped, spaces to -)."""
    seen: dict[str, int] = {}
    out = set()
    for line in split_page(page.read_text())[0].splitlines():
        heading = re.match(r"#{1,6}\s+(.*)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return out


def test_every_relative_link_resolves_to_a_file_and_heading():
    broken = []
    for page in PAGES:
        for target in LINK.findall(split_page(page.read_text())[0]):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked offline
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_reachable_from_the_readme():
    reached, todo = set(), [REPO / "README.md"]
    while todo:
        page = todo.pop()
        reached.add(page)
        for target in LINK.findall(split_page(page.read_text())[0]):
            file = (page.parent / target.partition("#")[0]).resolve()
            if file.suffix == ".md" and file.is_file() and file not in reached:
                todo.append(file)
    assert {p.resolve() for p in PAGES} <= reached


def test_config_reference_equals_what_the_schema_generates():
    from rft.config.reference import COMMAND, render

    committed = (REPO / "docs" / "config-reference.md").read_text()
    assert committed == render(), f"docs/config-reference.md is stale: run `{COMMAND}`"


def test_the_reference_lists_every_schema_key_with_its_comment():
    import dataclasses

    from rft.config.reference import field_notes, sections

    page = (REPO / "docs" / "config-reference.md").read_text()
    for section in sections():
        _, notes = field_notes(section.cls)
        for f in dataclasses.fields(section.cls):
            if f.init:
                assert f"| `{f.name}` |" in page, (section.path, f.name)
                assert notes.get(f.name), f"{section.cls.__name__}.{f.name} has no comment"
    # A hand-checked row: the type, default, range and comment of algorithm.repeat_times.
    assert "| `repeat_times` | int | `1` | >= 1 | samples per task (the group size) |" in page
