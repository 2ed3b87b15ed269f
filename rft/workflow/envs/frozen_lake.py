"""``frozen_lake_workflow``: walk a seeded FrozenLake grid from start to goal, avoiding holes.

Trinity-RFT's workflow (trinity/common/workflows/envs/frozen_lake/workflow.py) over gymnasium's
toy-text grid, rebuilt here without gymnasium: a task row holds ``seed``, ``size`` and ``p`` (the
share of frozen tiles); the map (one start, one goal, a path of at most ``env_max_steps`` moves)
comes from rft's own seeded generator, so a seed gives another map than in Trinity. Each turn
the model sees the grid and ends its reply with the move in backticks (```Up```); reward 1 when
it reaches the goal within ``agent_max_steps`` turns, else 0 (a hole ends the episode).
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass, field

from rft.workflow.base import MultiTurnWorkflow
from rft.workflow.experience import Experience
from rft.workflow.registry import register_workflow

FROZEN, HOLE, START, GOAL = "F", "H", "S", "G"
MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}  # (row, col) steps
# Trinity's action numbers: 1 Left, 2 Down, 3 Right, 4 Up.
_NUMBERED = dict(zip(("1", "2", "3", "4"), MOVES))
_SHOWN = {FROZEN: "_", START: "_", HOLE: "O", GOAL: "G"}
_LAST_BACKTICKS = re.compile(r"```(.*?)```", re.DOTALL)
_ARGS = {"env_max_steps": 8, "agent_max_steps": 10, "is_slippery": False, "max_steps": None}

SYSTEM_PROMPT = """You walk on a frozen lake drawn as a grid, one row per line.
Symbols: P you, _ frozen ice (safe), O a hole (falling in ends the game), G the goal.
Reach G: you win when P and G are on the same tile. Holes give nothing; the goal gives 1.
Each turn, think briefly, then end your reply with exactly one move in triple backticks:
```Up```, ```Down```, ```Left``` or ```Right```. Moving off the grid leaves you in place.
Use as few moves as you can."""


@dataclass
class Lake:
    """A FrozenLake grid and the player on it."""

    rows: list[str]  # tiles: F, H, S (start) and G, one string per row
    player: tuple[int, int]
    rng: random.Random = field(default_factory=random.Random)  # the slippery ice's draws
    slippery: bool = False  # a move goes sideways with probability 2/3 (gymnasium's rule)

    @property
    def size(self) -> int:
        return len(self.rows)

    def tile(self, pos: tuple[int, int]) -> str:
        return self.rows[pos[0]][pos[1]]

    @property
    def done(self) -> bool:
        return self.tile(self.player) in (HOLE, GOAL)

    def step(self, move: str) -> bool:
        """Move (``left/down/right/up``); return whether the player's tile changed."""
        if self.slippery:
            names = list(MOVES)
            i = names.index(move)
            move = self.rng.choice((names[(i - 1) % 4], move, names[(i + 1) % 4]))
        dr, dc = MOVES[move]
        r, c = self.player[0] + dr, self.player[1] + dc
        before = self.player
        if 0 <= r < self.size and 0 <= c < self.size:
            self.player = (r, c)
        return self.player != before

    def render(self) -> str:
        lines = []
        for r, row in enumerate(self.rows):
            cells = [_SHOWN[t] for t in row]
            if self.player[0] == r:
                cells[self.player[1]] = "P"
            lines.append("  ".join(cells))
        return "\n".join(lines)


def shortest_path(rows: list[str], start: tuple[int, int]) -> int | None:
    """Fewest moves from ``start`` to the goal without entering a hole (None: unreachable)."""
    size, seen = len(rows), {start}
    queue = deque([(start, 0)])
    while queue:
        (r, c), steps = queue.popleft()
        if rows[r][c] == GOAL:
            return steps
        for dr, dc in MOVES.values():
            nxt = (r + dr, c + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in seen:
                if rows[nxt[0]][nxt[1]] != HOLE:
                    seen.add(nxt)
                    queue.append((nxt, steps + 1))
    return None


def generate_lake(seed: int, size: int, p: float, max_steps: int) -> tuple[list[str], tuple]:
    """A ``size`` x ``size`` map, tiles frozen with probability ``p``, whose goal is at most
    ``max_steps`` moves from the start; the same arguments give the same map."""
    if size < 2 or not 0 < p <= 1 or max_steps < 1:
        raise ValueError(f"frozen lake: need size >= 2, 0 < p <= 1, max_steps >= 1 (got "
                         f"size={size}, p={p}, max_steps={max_steps})")  # fmt: skip
    rng = random.Random(seed)
    while True:
        grid = [[FROZEN if rng.random() < p else HOLE for _ in range(size)] for _ in range(size)]
        cells = [(r, c) for r in range(size) for c in range(size)]
        start, goal = rng.sample(cells, 2)
        grid[start[0]][start[1]], grid[goal[0]][goal[1]] = START, GOAL
        rows = ["".join(row) for row in grid]
        steps = shortest_path(rows, start)
        if steps is not None and steps <= max_steps:
            return rows, start


def parse_move(reply: str) -> str | None:
    """The move in the reply's last triple-backtick block (a word or Trinity's 1-4), or None."""
    blocks = _LAST_BACKTICKS.findall(reply or "")
    if not blocks:
        return None
    text = blocks[-1].strip().lower()
    return text if text in MOVES else _NUMBERED.get(text)


@register_workflow("frozen_lake_workflow")
class FrozenLakeWorkflow(MultiTurnWorkflow):
    can_repeat = False

    def run(self) -> list[Experience]:
        args = {**_ARGS, **self.task.workflow_args}
        row = self.task.raw_task or {}
        seed = int(row.get("seed", 42))
        desc = args.get("desc")
        if desc:
            rows = [str(r) for r in desc]
            start = next((r, line.index(START)) for r, line in enumerate(rows) if START in line)
        else:
            rows, start = generate_lake(
                seed, int(row.get("size", 4)), float(row.get("p", 0.8)), int(args["env_max_steps"])
            )
        lake = Lake(rows, start, random.Random(seed), bool(args["is_slippery"]))
        turns_allowed = int(args["max_steps"] or args["agent_max_steps"])  # Trinity's old name
        messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        turns, invalid, moved = 0, 0, True
        for turn in range(turns_allowed):
            note = "" if moved else "\nYour last move did not change your tile."
            messages.append({
                "role": "user",
                "content": f"Turn {turn + 1} of {turns_allowed}:\n{lake.render()}{note}\nYour move?",
            })  # fmt: skip
            reply = self.model.chat(messages)[0]
            if reply.truncate_status == "prompt_truncated":
                break
            turns += 1
            messages.append({"role": "assistant", "content": reply.response_text})
            move = parse_move(reply.response_text)
            invalid += move is None
            moved = move is not None and lake.step(move)
            if lake.done:
                break
        success = float(lake.tile(lake.player) == GOAL)
        info = {"success": success, "env_steps": turns, "invalid_moves": invalid}
        return [self.process_messages_to_experience(messages, success, info=info)]
