"""An AgentScope ReAct agent with a calculator tool, trained by rft (a plugin module: pass this
folder with ``--plugin-dir examples/agentscope_react``).

It is Trinity's ``as_react_workflow`` (rft/workflow/envs/agentscope_react.py) with one tool:
the agent (agentscope 2.0) may call ``calculate`` through the explorer's OpenAI-compatible
endpoint, which records every call; the reward is the boxed answer's accuracy. Config:
``examples/agentscope_react/gsm8k_calculator.yaml``.
"""

from rft.workflow import register_workflow
from rft.workflow.envs.agentscope_react import AgentScopeReActWorkflow
from rft.workflow.envs.calculator import evaluate


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses, e.g. "(12 + 3) * 4".

    Args:
        expression (str): the expression to evaluate.
    """
    try:
        return evaluate(expression)
    except Exception as e:  # the model's expression: any error goes back to it as text
        return f"error: {e}"


@register_workflow("calculator_react_workflow")
class CalculatorReActWorkflow(AgentScopeReActWorkflow):
    def tools(self):
        return [calculate]
