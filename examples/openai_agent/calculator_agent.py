"""A calculator agent written only against the OpenAI SDK (it does not import rft).

rft's agent_program_workflow runs it once per task run with OPENAI_BASE_URL, OPENAI_API_KEY and
OPENAI_MODEL pointing at the explorer's endpoint, and the task row as JSON on stdin. The agent
asks the model, runs the calculator itself when the model writes <calc>expression</calc>, and
prints its final answer as its last line; rft scores that line and trains on the calls.
"""

from __future__ import annotations

import ast
import json
import operator
import os
import re
import sys

from openai import OpenAI

SYSTEM = (
    "You have a calculator. Use it like this.\n"
    "User: What is 23 * 47?\nAssistant: <calc>23*47</calc>\nUser: <result>1081</result>\n"
    "Assistant: <answer>1081</answer>"
)
CALL = re.compile(r"<calc>(.*?)(?:</calc>)?\s*$", re.DOTALL)
OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def calculate(expression: str) -> str:
    """+ - * / and parentheses on numbers; anything else is an error the model reads."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError("only + - * / and numbers")

    try:
        result = value(ast.parse(expression.replace("x", "*"), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        return f"error: {e}"
    return str(int(result)) if float(result).is_integer() else f"{result:.6g}"


def final_answer(text: str) -> str:
    tagged = re.findall(r"<answer>\s*(.*?)\s*</answer>", text, re.DOTALL)
    if tagged:
        return tagged[-1]
    numbers = re.findall(r"-?\d+(?:\.\d+)?", text)
    return numbers[-1] if numbers else ""


def main() -> int:
    task = json.loads(sys.stdin.read() or os.environ.get("RFT_TASK", "{}"))
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    model = os.environ.get("OPENAI_MODEL", "policy")
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"{task['question']} Use the calculator."},
    ]
    for _ in range(int(os.environ.get("AGENT_MAX_TURNS", "3"))):
        reply = client.chat.completions.create(model=model, messages=messages, stop=["</calc>"])
        text = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})
        asked = CALL.search(text)
        if asked is None:
            print(final_answer(text))
            return 0
        messages.append(
            {"role": "user", "content": f"<result>{calculate(asked.group(1))}</result>"}
        )
    print("")  # the turns ran out on a calculator call: no answer
    return 0


if __name__ == "__main__":
    sys.exit(main())
