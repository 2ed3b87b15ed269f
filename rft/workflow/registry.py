"""Finding a workflow class: by registered name, Trinity's dotted path ``pkg.module.Class``, or
``pkg.module:Class``; user modules come from plugin directories.

Data in: a name from the config, plugin directories (``--plugin-dir``, ``RFT_PLUGIN_DIRS``,
Trinity's ``TRINITY_PLUGIN_DIRS``). Data out: the class, checked
(:func:`~rft.workflow.base.workflow_signature_problem`), or a WorkflowError saying what to do.
Importing a plugin directory runs its modules, each on its own: one that fails to import is a
warning, and every "not found" error afterwards names it. The launchers pass the directories on
through the environment, so every node imports the same ones.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from rft.config.known_names import TRINITY_NAMES
from rft.config.known_names import WORKFLOWS as TRINITY_WORKFLOWS
from rft.config.typed_dict import not_supported
from rft.entry import PLUGIN_DIRS_ENV, TRINITY_PLUGIN_DIRS_ENV
from rft.errors import WorkflowError, did_you_mean
from rft.workflow.base import workflow_signature_problem
from rft.workflow.trinity_alias import install as install_trinity_alias

log = logging.getLogger(__name__)

SHIPPED_MODULES = (
    "rft.workflow.envs.agentscope_react",
    "rft.workflow.envs.alfworld",
    "rft.workflow.envs.calculator",
    "rft.workflow.envs.frozen_lake",
    "rft.workflow.envs.guess_number",
    "rft.workflow.envs.openenv_env",
    "rft.workflow.envs.r3l_alfworld",
    "rft.workflow.envs.r3l_countdown",
    "rft.workflow.envs.r3l_dapo",
    "rft.workflow.envs.r3l_sciworld",
    "rft.workflow.envs.raft_alfworld",
    "rft.workflow.envs.sciworld",
    "rft.workflow.envs.toolcall",
    "rft.workflow.envs.verifiers_env",
    "rft.workflow.math_eval",
    "rft.workflow.math_rm",
    "rft.workflow.recording",
    "rft.workflow.rubric_judge",
)


class Registry:
    """Classes by name (Trinity's ``Registry``): ``@register_module(name)`` on a class, or
    ``register_module(name, cls)``; ``force`` replaces a class already under that name."""

    def __init__(self, kind: str):
        self.kind = kind  # what it holds, for messages: "workflow", "reward function"
        self.classes: dict[str, type] = {}

    @property
    def name(self) -> str:
        return self.kind

    @property
    def modules(self) -> dict[str, type]:
        """Trinity's name of :attr:`classes`."""
        return self.classes

    def register_module(
        self,
        module_name: Optional[str] = None,
        module_cls: Optional[type] = None,
        force: bool = False,
        lazy: bool = False,  # Trinity's flag; it has no effect there either
        *,
        name: Optional[str] = None,  # Trinity's guide spells it register_module(name="...")
    ) -> Any:
        """The decorator; with ``module_cls``, registers it and returns it."""
        module_name = module_name or name
        if not module_name:
            raise WorkflowError(f"{self.kind} registry: register_module needs a name")

        def add(cls: type) -> type:
            known = self.classes.get(module_name)
            if known is not None and known is not cls and not force:
                raise WorkflowError(
                    f"{self.kind} name {module_name!r} is taken by "
                    f"{known.__module__}.{known.__qualname__}; pick another name"
                )
            self.classes[module_name] = cls
            return cls

        return add if module_cls is None else add(module_cls)

    def get(self, name: str) -> Optional[type]:
        return self.classes.get(name)


WORKFLOWS = Registry("workflow")


def register_workflow(name: str) -> Callable[[type], type]:
    """Class decorator: the workflow answers to ``name`` in configs."""
    return WORKFLOWS.register_module(name)


def plugin_dirs(extra: Iterable[str] = ()) -> list[Path]:
    """Plugin directories: ``extra`` (``--plugin-dir``), then both environment variables."""
    found: list[Path] = []
    for spec in [
        *extra,
        os.environ.get(PLUGIN_DIRS_ENV, ""),
        os.environ.get(TRINITY_PLUGIN_DIRS_ENV, ""),
    ]:
        for part in str(spec).split(os.pathsep):
            if part and Path(part).absolute() not in found:
                found.append(Path(part).absolute())
    return found


_loaded: set[Path] = set()  # plugin directories imported in this process
# plugin module file -> its import error ("Type: message"): named by every "not found" error,
# since the workflow asked for may be in it
_failed: dict[Path, str] = {}


def load_plugins(extra: Iterable[str] = ()) -> list[str]:
    """Import every ``*.py`` module (and package) of each plugin directory, once; the modules
    imported. A missing directory is a WorkflowError; a module that fails to import is logged,
    remembered (:func:`failed_plugins_note`) and skipped, so the others still load. Trinity's
    module names serve rft's objects in these modules (:mod:`rft.workflow.trinity_alias`)
    unless Trinity-RFT is installed."""
    install_trinity_alias()
    imported = []
    for folder in plugin_dirs(extra):
        if folder in _loaded:
            continue
        if not folder.is_dir():
            raise WorkflowError(
                f"plugin directory {folder} does not exist (from --plugin-dir, "
                f"{PLUGIN_DIRS_ENV} or {TRINITY_PLUGIN_DIRS_ENV}); fix the path"
            )
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
        names = []
        for entry in _plugin_modules(folder):
            name = _import_plugin(entry)
            if name is not None:
                names.append(name)
        _loaded.add(folder)
        log.info("plugins from %s: %s", folder, names or "none")
        imported += names
    return imported


def _plugin_modules(folder: Path) -> list[Path]:
    """The folder's ``*.py`` files (``__init__.py`` aside) and packages, sorted."""
    return [
        entry
        for entry in sorted(folder.iterdir())
        if (entry.is_dir() and (entry / "__init__.py").exists())
        or (entry.suffix == ".py" and entry.name != "__init__.py")
    ]


def _import_plugin(entry: Path) -> Optional[str]:
    """Import one plugin module or package; its name, or None (logged, remembered) if it fails."""
    name = entry.name if entry.is_dir() else entry.stem
    try:
        importlib.import_module(name)
    except Exception as e:  # a user's module: any error it raises is its failure to import
        _failed[entry] = f"{type(e).__name__}: {e}"
        log.warning("plugin module %s failed to import: %s", entry, _failed[entry])
        return None
    return name


def failed_plugins_note() -> str:
    """For an error about a workflow not found: the plugin modules that failed to import (the
    workflow may be in one of them), with their errors; "" when none did."""
    if not _failed:
        return ""
    listed = "; ".join(f"{path} ({error})" for path, error in sorted(_failed.items()))
    return (
        f" Plugin modules that failed to import, which may hold it: {listed}; fix them "
        "(or install what they import)."
    )


def _import_class(spec: str) -> type:
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # a user's module may raise anything while it is imported
        raise WorkflowError(
            f"workflow {spec!r}: cannot import module {module_name!r} "
            f"({type(e).__name__}: {e}); put its folder in a plugin directory (--plugin-dir "
            f"or {PLUGIN_DIRS_ENV}) or on PYTHONPATH, and install what it imports."
            f"{failed_plugins_note()}"
        ) from e
    cls = getattr(module, attr, None)
    if cls is None:
        names = [n for n in vars(module) if not n.startswith("_")]
        raise WorkflowError(
            f"workflow {spec!r}: module {module_name!r} "
            f"({getattr(module, '__file__', '?')}) has no {attr!r}."
            f"{did_you_mean(attr, names, TRINITY_NAMES)}{failed_plugins_note()}"
        )
    return cls


def workflow_class(spec: str, builtin_names: Iterable[str] = ()) -> type:
    """The workflow class named ``spec`` (registered name, ``pkg.module.Class`` or
    ``pkg.module:Class``), plugins loaded first and the class checked."""
    load_plugins()
    for module in SHIPPED_MODULES:
        importlib.import_module(module)
    cls = WORKFLOWS.get(spec)
    if cls is None and spec in TRINITY_WORKFLOWS:
        raise not_supported(
            f"workflow {spec}",
            f"{TRINITY_WORKFLOWS[spec]}. rft does not ship it; bring it as a plugin: a "
            f"module with a rft.workflow.Workflow subclass registered as "
            f"@register_workflow({spec!r}) in a --plugin-dir / {PLUGIN_DIRS_ENV} folder "
            "(with what it needs installed on the compute nodes)." + failed_plugins_note(),
        )
    if cls is None and ("." in spec or ":" in spec):
        cls = _import_class(spec)
    if cls is None:
        known = sorted([*builtin_names, *WORKFLOWS.classes])
        raise WorkflowError(
            f"workflow {spec!r} is not a known name ({known}) nor a "
            f"'pkg.module.Class' path.{did_you_mean(spec, known, TRINITY_NAMES)}{failed_plugins_note()}"
        )
    problem = workflow_signature_problem(cls)
    if problem:
        raise WorkflowError(f"workflow {spec!r}: {problem}")
    return cls
