"""Trinity-RFT's workflow API under its own module names, for plugin files written for Trinity.

Data in: an import of ``trinity.<module>`` (``from trinity.common.workflows import
SimpleWorkflow``) in a process where Trinity-RFT itself is not installed. Data out: a module
whose attributes are rft's objects of the same names (:data:`TRINITY_API`, served by
:mod:`rft.workflow`); a name rft lacks fails with one ``ImportError`` line naming it. Installed
by :func:`install` (the plugin loader calls it), never when Trinity is importable: then
``trinity`` is Trinity's.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any, Optional, Sequence

ROOT = "trinity"

# Each public name a Trinity workflow, reward or agent file imports, and the Trinity module it
# comes from (v0.5.x and main, 2026). rft.workflow exports every one of them (a test checks).
TRINITY_API: dict[str, str] = {
    # trinity.common.workflows (workflow.py, customized_math_workflows.py, step_wise_workflow.py,
    # eval_workflow.py)
    "Task": "trinity.common.workflows",
    "Workflow": "trinity.common.workflows",
    "MultiTurnWorkflow": "trinity.common.workflows",
    "BaseSimpleWorkflow": "trinity.common.workflows",
    "SimpleWorkflow": "trinity.common.workflows",
    "AsyncSimpleWorkflow": "trinity.common.workflows",
    "MathWorkflow": "trinity.common.workflows",
    "AsyncMathWorkflow": "trinity.common.workflows",
    "MathBoxedWorkflow": "trinity.common.workflows",
    "AsyncMathBoxedWorkflow": "trinity.common.workflows",
    "MathEvalWorkflow": "trinity.common.workflows",
    "AsyncMathEvalWorkflow": "trinity.common.workflows",
    "MathRMWorkflow": "trinity.common.workflows",
    "AsyncMathRMWorkflow": "trinity.common.workflows",
    "StepWiseRewardWorkflow": "trinity.common.workflows",
    "AsyncStepWiseRewardWorkflow": "trinity.common.workflows",
    "RewardPropagationWorkflow": "trinity.common.workflows",
    "AsyncRewardPropagationWorkflow": "trinity.common.workflows",
    "WorkflowWithRecording": "trinity.common.workflows",
    "WORKFLOWS": "trinity.common.workflows",
    # trinity.common.experience
    "Experience": "trinity.common.experience",
    "EID": "trinity.common.experience",
    # trinity.common.rewards
    "RewardFn": "trinity.common.rewards",
    "REWARD_FUNCTIONS": "trinity.common.rewards",
    "MathRewardFn": "trinity.common.rewards",
    "MathBoxedRewardFn": "trinity.common.rewards",
    "AccuracyReward": "trinity.common.rewards",
    "FormatReward": "trinity.common.rewards",
    "CountDownRewardFn": "trinity.common.rewards",
    "MathDAPORewardFn": "trinity.common.rewards",
    "RLCRRewardFn": "trinity.common.rewards",
    "verify_math_answer": "trinity.utils.eval_utils",
    "validate_think_pattern": "trinity.utils.eval_utils",
    "simple_answer_parser": "trinity.utils.eval_utils",
    "compute_score": "trinity.utils.eval_utils",
    # trinity.common.models.model
    "ModelWrapper": "trinity.common.models.model",
    # trinity.common.config
    "FormatConfig": "trinity.common.config",
    "GenerationConfig": "trinity.common.config",
    # trinity.utils.log
    "get_logger": "trinity.utils.log",
}


def trinity_installed() -> bool:
    """Whether Trinity-RFT itself is importable (then the alias stays off)."""
    if any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        return False
    return importlib.util.find_spec(ROOT) is not None


class _AliasModule(types.ModuleType):
    """``trinity.<...>``: attributes are rft's objects of Trinity's names."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in TRINITY_API:  # rft.workflow (the package this module is in) serves them
            return getattr(importlib.import_module("rft.workflow"), name)
        raise ImportError(
            f"{self.__name__}.{name}: Trinity-RFT's name {name!r} is not part of rft's Trinity "
            f"workflow API (rft serves `trinity` imports with rft.workflow's names; the table "
            "is in docs/agentic-workflows.md); rewrite that import for rft, or install "
            "Trinity-RFT's package if the module needs Trinity itself",
            name=name,
        )


class _AliasLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _AliasModule(spec.name)
        module.__path__ = []  # a package: trinity.common.workflows.workflow imports too
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Any = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != ROOT and not fullname.startswith(ROOT + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(), is_package=True)


def install() -> bool:
    """Serve ``trinity.*`` imports with rft's names, unless Trinity is installed or the alias
    is already on; whether it is on now."""
    if any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        return True
    if trinity_installed():
        return False
    sys.meta_path.append(_AliasFinder())
    return True
