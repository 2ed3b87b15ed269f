"""Plugin directories (:mod:`rft.workflow.registry`): each module is imported on its own, so a
broken module neither stops the others nor hides; a missing directory stays an error."""

from __future__ import annotations

import importlib
import logging
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from rft.errors import NotSupportedError, WorkflowError
from rft.workflow import registry


@pytest.fixture
def clean_registry(monkeypatch):
    """The process-wide plugin state and workflow registry, restored after the test; plugin
    modules get unique names, and are taken out of sys.modules afterwards."""
    monkeypatch.setattr(registry, "_loaded", set())
    monkeypatch.setattr(registry, "_failed", {})
    for module in registry.SHIPPED_MODULES:  # registered in the real registry, once
        importlib.import_module(module)
    monkeypatch.setattr(registry.WORKFLOWS, "classes", dict(registry.WORKFLOWS.classes))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv(registry.TRINITY_PLUGIN_DIRS_ENV, raising=False)
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("plugtest_"):
            del sys.modules[name]


@dataclass
class Plugins:
    folder: Path
    good: str  # the good module's name
    workflow: str  # the name it registers
    broken: Path  # the module that imports a missing package
    missing: str  # that package


def plugin_folder(tmp_path: Path) -> Plugins:
    """A folder with a good module (registers a workflow) and one that imports a missing
    package, all named uniquely."""
    tag = uuid.uuid4().hex[:8]
    folder = tmp_path / "plugins"
    folder.mkdir()
    good, workflow, missing = (
        f"plugtest_good_{tag}",
        f"plugtest_workflow_{tag}",
        f"plugtest_no_{tag}",
    )
    (folder / f"{good}.py").write_text(
        "from rft.workflow import Workflow, register_workflow\n"
        f"@register_workflow({workflow!r})\n"
        "class GoodWorkflow(Workflow):\n"
        "    def run(self):\n"
        "        return []\n"
    )
    broken = folder / f"plugtest_broken_{tag}.py"
    broken.write_text(f"import {missing}\n")
    return Plugins(folder, good, workflow, broken, missing)


def test_a_broken_module_is_a_warning_and_the_others_load(clean_registry, tmp_path, caplog):
    p = plugin_folder(tmp_path)
    with caplog.at_level(logging.WARNING, logger=registry.__name__):
        assert registry.load_plugins([str(p.folder)]) == [p.good]
    assert registry.workflow_class(p.workflow).__name__ == "GoodWorkflow"
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning == (
        f"plugin module {p.broken} failed to import: ModuleNotFoundError: "
        f"No module named '{p.missing}'"
    )
    assert registry.load_plugins([str(p.folder)]) == []  # each folder once per process


def test_a_workflow_not_found_names_the_modules_that_failed(clean_registry, tmp_path, monkeypatch):
    p = plugin_folder(tmp_path)
    monkeypatch.setenv(registry.PLUGIN_DIRS_ENV, str(p.folder))
    with pytest.raises(WorkflowError) as raised:
        registry.workflow_class("plugtest_not_registered")
    message = str(raised.value)
    assert "is not a known name" in message and p.workflow in message
    assert (
        f"failed to import, which may hold it: {p.broken} (ModuleNotFoundError: "
        f"No module named '{p.missing}')" in message
    )
    with pytest.raises(WorkflowError, match="has no 'Nope'.*failed to import"):
        registry.workflow_class(f"{p.good}.Nope")
    with pytest.raises(WorkflowError, match=r"cannot import module .*\(ModuleNotFoundError: "):
        registry.workflow_class(f"{p.broken.stem}.Workflow")
    with pytest.raises(NotSupportedError, match=f"rft does not ship it.*{p.broken.name}"):
        registry.workflow_class("webshop_workflow")  # a Trinity name: a plugin may bring it


def test_without_failed_modules_the_error_says_nothing_of_them(clean_registry, tmp_path):
    p = plugin_folder(tmp_path)
    p.broken.unlink()
    registry.load_plugins([str(p.folder)])
    with pytest.raises(WorkflowError) as raised:
        registry.workflow_class("plugtest_not_registered")
    assert "failed to import" not in str(raised.value)


def test_a_module_raising_at_import_is_a_workflow_error_by_dotted_path(clean_registry, tmp_path):
    folder = tmp_path / "plugins"
    folder.mkdir()
    name = f"plugtest_raises_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text("raise ValueError('no config here')\n")
    registry.load_plugins([str(folder)])
    with pytest.raises(WorkflowError, match="ValueError: no config here"):
        registry.workflow_class(f"{name}.Workflow")


def test_a_missing_plugin_directory_stays_an_error(clean_registry, tmp_path):
    with pytest.raises(WorkflowError, match="does not exist"):
        registry.load_plugins([str(tmp_path / "missing")])
