"""One ``train_step`` without DeepSpeed: a bigram model scored by hand at a temperature, engines
that stand in for DeepSpeed's on this process alone (one without updates, one with plain SGD)."""

from __future__ import annotations

import torch

VOCAB, TEMPERATURE = 5, 0.5
# Two groups of two rollouts: (group, prompt, response, reward); 11 response tokens in all.
TWO_GROUPS = [
    ("g0", [1, 2], [3, 4, 0], 1.0),
    ("g0", [1, 2], [2, 2], 0.0),
    ("g1", [4], [1, 3], 1.0),
    ("g1", [4], [0, 1, 2, 3], 0.0),
]


class BigramLM(torch.nn.Module):
    """Logits at position t are a row of a table picked by token t: enough for the trainer's
    forward (``logits_to_keep`` positions, ``.logits``), and easy to score by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(
            torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(0))
        )

    def forward(self, input_ids, attention_mask, use_cache, logits_to_keep):
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.table[input_ids][:, logits_to_keep])  # [B, K, V]


class FakeEngine(torch.nn.Module):
    """What train_step asks of a DeepSpeed engine, on one process, without updates."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.module = model

    def forward(self, **kwargs):
        return self.module(**kwargs)

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool) -> None:
        loss.backward()

    def step(self) -> None:
        self.module.zero_grad()

    def get_global_grad_norm(self) -> float:
        return 0.0

    def get_lr(self) -> list[float]:
        return [0.0]


def one_rank():
    """This process alone, on the CPU (gloo): the ``DistInfo`` of a one-rank step."""
    from rft.trainer import engine

    return engine.DistInfo(
        rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo"
    )


def step_on_one_rank(
    policy: torch.nn.Module, exps: list, cfg, critic: torch.nn.Module | None = None, step: int = 1
) -> dict:
    """One ``train_step`` of ``policy`` (a :class:`FakeEngine` or one that updates) on this
    process alone, without a reference model; with ``critic`` (the same kind), PPO's."""
    from rft.trainer import engine
    from rft.trainer.algorithm import build_loss_fns
    from rft.trainer.step import train_step

    def actor(e: torch.nn.Module):
        return engine.Actor(e, 2, None)

    fns = build_loss_fns(cfg.algorithm)
    return train_step(
        actor(policy), None, exps, cfg, fns, one_rank(), step=step, pad_id=0,
        critic=None if critic is None else actor(critic),
    )  # fmt: skip


def tempered_logprobs(model: BigramLM, prompt: list[int], response: list[int]) -> list[float]:
    """log softmax(table[previous token] / T)[token] for each response token."""
    ids = prompt + response
    table = torch.log_softmax(model.table.detach() / TEMPERATURE, dim=-1)  # [V, V]
    return [float(table[ids[len(prompt) - 1 + j], tok]) for j, tok in enumerate(response)]


class SGDEngine(FakeEngine):
    """A fake engine that updates: plain SGD, the gradient norm before the step."""

    def step(self) -> None:
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        self.norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
        with torch.no_grad():
            for p in self.module.parameters():
                p -= 0.1 * p.grad
        self.module.zero_grad()

    def get_global_grad_norm(self) -> float:
        return self.norm
