"""The workflow API, in one place a workflow author imports from (Trinity-RFT-shaped):

    from rft.workflow import Workflow, MultiTurnWorkflow, Task, Experience, register_workflow

A workflow turns a :class:`Task` into :class:`Experience` records by talking to the model
handle (:class:`ModelWrapper`); the explorer runs it. Reward functions, the single-turn
built-ins and the token bookkeeping live in this package's modules.
"""

from rft.workflow.base import MultiTurnWorkflow, Workflow
from rft.workflow.experience import EID, Experience
from rft.workflow.log import get_logger
from rft.workflow.math_eval import AsyncMathEvalWorkflow, MathEvalWorkflow
from rft.workflow.math_rm import AsyncMathRMWorkflow, MathRMWorkflow
from rft.workflow.model import ModelWrapper
from rft.workflow.recording import WorkflowWithRecording
from rft.workflow.registry import WORKFLOWS, register_workflow
from rft.workflow.reward_fn import (
    REWARD_FUNCTIONS,
    AccuracyReward,
    CountDownRewardFn,
    FinalNumberRewardFn,
    FormatReward,
    MathBoxedRewardFn,
    MathDAPORewardFn,
    MathRewardFn,
    RewardFn,
    RLCRRewardFn,
    compute_score,
    simple_answer_parser,
    validate_think_pattern,
    verify_math_answer,
)
from rft.workflow.simple import (
    AsyncMathBoxedWorkflow,
    AsyncMathWorkflow,
    AsyncSimpleWorkflow,
    BaseSimpleWorkflow,
    MathBoxedWorkflow,
    MathWorkflow,
    SimpleWorkflow,
)
from rft.workflow.step_wise import (
    AsyncRewardPropagationWorkflow,
    AsyncStepWiseRewardWorkflow,
    RewardPropagationWorkflow,
    StepWiseRewardWorkflow,
)
from rft.workflow.task import FormatConfig, GenerationConfig, Task
from rft.workflow.tools import ToolBox

__all__ = [
    "EID",
    "FormatConfig",
    "Experience",
    "GenerationConfig",
    "ModelWrapper",
    "MultiTurnWorkflow",
    "WorkflowWithRecording",
    "StepWiseRewardWorkflow",
    "AsyncStepWiseRewardWorkflow",
    "RewardPropagationWorkflow",
    "AsyncRewardPropagationWorkflow",
    "BaseSimpleWorkflow",
    "SimpleWorkflow",
    "AsyncSimpleWorkflow",
    "MathWorkflow",
    "AsyncMathWorkflow",
    "MathBoxedWorkflow",
    "AsyncMathBoxedWorkflow",
    "MathEvalWorkflow",
    "AsyncMathEvalWorkflow",
    "MathRMWorkflow",
    "AsyncMathRMWorkflow",
    "RewardFn",
    "REWARD_FUNCTIONS",
    "AccuracyReward",
    "FormatReward",
    "MathRewardFn",
    "MathBoxedRewardFn",
    "CountDownRewardFn",
    "MathDAPORewardFn",
    "FinalNumberRewardFn",
    "RLCRRewardFn",
    "verify_math_answer",
    "validate_think_pattern",
    "simple_answer_parser",
    "compute_score",
    "Task",
    "ToolBox",
    "WORKFLOWS",
    "Workflow",
    "get_logger",
    "register_workflow",
]
