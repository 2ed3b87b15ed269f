"""The workflow API, in one place a workflow author imports from (Trinity-RFT-shaped):

    from rft.workflow import Workflow, MultiTurnWorkflow, Task, Experience, register_workflow

A workflow turns a :class:`Task` into :class:`Experience` records by talking to the model
handle (:class:`ModelWrapper`); the explorer runs it. Reward functions, the single-turn
built-ins and the token bookkeeping live in this package's modules.
"""

from rft.workflow.base import MultiTurnWorkflow, StepWiseRewardWorkflow, Workflow
from rft.workflow.experience import EID, Experience
from rft.workflow.model import ModelWrapper
from rft.workflow.recording import RecordingWorkflow
from rft.workflow.registry import WORKFLOWS, register_workflow
from rft.workflow.task import GenerationArgs, Task
from rft.workflow.tools import ToolBox

__all__ = [
    "EID",
    "Experience",
    "GenerationArgs",
    "ModelWrapper",
    "MultiTurnWorkflow",
    "RecordingWorkflow",
    "StepWiseRewardWorkflow",
    "Task",
    "ToolBox",
    "WORKFLOWS",
    "Workflow",
    "register_workflow",
]
