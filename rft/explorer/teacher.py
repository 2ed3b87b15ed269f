"""The teacher of on-policy distillation (``algorithm.advantage_fn`` on_policy_distill or jsd):
its log-prob of each token the student sampled, stored on the experience (``teacher_logprobs``).

Data in: ``explorer.auxiliary_models[0]``, a causal LM folder with the student's vocabulary
(the student's token ids are scored as they are, as Trinity's workflow does:
trinity/common/workflows/on_policy_distill_workflow.py), and a step's experiences. Data out:
the same experiences with ``teacher_logprobs`` set. transformers forward passes on the
explorer's next GPU (after the engine's), else its CPUs; torch loads only with the model. A
teacher the trainer holds (:func:`rft.config.teacher.teacher_in_trainer`) is skipped here.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from rft.buffer.experience import Experience
from rft.config.auxiliary import auxiliary_tp, forward_dtype
from rft.config.schema import Config
from rft.config.teacher import TEACHER_KEY, teacher_in_trainer, uses_teacher
from rft.errors import ConfigError, DataError
from rft.explorer.reward_model import MAX_TOKENS_PER_BATCH, micro_batches, pad_right, scorer_device
from rft.models import SEQUENCE_CLASSIFICATION_SUFFIX, check_model_dir, read_config

log = logging.getLogger(__name__)

# A log-prob below this is stored as this floor: float32 records hold finite numbers only, and a token
# the teacher gives e^-10000 is as wrong as one it gives 0.
MIN_TEACHER_LOGPROB = -1e4
TEACHER_TIME_S = "teacher_time_s"  # metric: seconds of teacher forward passes in the step
TEACHER_KL = "teacher_kl"  # metric: mean per-token log-prob gap, student minus teacher


def check_teacher_dir(cfg: Config) -> None:
    """The teacher folder (dry run and load): a causal LM with weights whose vocabulary holds
    every token id the student can sample."""
    path = cfg.explorer.auxiliary_models[0].model_path
    info = check_model_dir(path, key=f"{TEACHER_KEY}.model_path")
    if any(a.endswith(SEQUENCE_CLASSIFICATION_SUFFIX) for a in info.architectures):
        raise ConfigError(
            f"{TEACHER_KEY}.model_path={path!r} is a reward model (a score head); with "
            f"algorithm.advantage_fn {cfg.algorithm.advantage_fn} it is the teacher: point it "
            "at a causal LM (*ForCausalLM) that shares the student's tokenizer"
        )
    student = read_config(cfg.model.model_path).get("vocab_size")
    if student and info.vocab_size and info.vocab_size < student:
        raise ConfigError(
            f"{TEACHER_KEY}.model_path={path!r}: vocab_size {info.vocab_size} < the student's "
            f"{student}; the teacher scores the student's token ids, so it needs the same "
            "tokenizer (a model of the same family)"
        )


def response_logprobs(
    logits: Any, input_ids: Any, prompt_len: int, length: int, temperature: float = 1.0
) -> Any:
    """log p(token_t | tokens before it) of the ``length`` response tokens after ``prompt_len``:
    ``logits`` ``[L, V]`` of one unpadded row, ``input_ids`` ``[L]``; returns ``[length]``."""
    import torch

    start = prompt_len - 1  # the logits at position t predict token t + 1
    window = logits[start : start + length].float() / temperature  # [length, V]
    targets = input_ids[prompt_len : prompt_len + length].long()  # [length]
    picked = torch.log_softmax(window, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked.clamp(min=MIN_TEACHER_LOGPROB)  # [length]


class Teacher:
    """A causal LM folder loaded with transformers in its ``dtype`` (unset: float32 on CPU,
    bfloat16 on CUDA; :func:`rft.config.auxiliary.forward_dtype`)."""

    def __init__(self, cfg: Config, device: str):
        check_teacher_dir(cfg)
        import torch
        from transformers import AutoModelForCausalLM

        start = time.monotonic()
        model_cfg = cfg.explorer.auxiliary_models[0]
        self.path, self.device = model_cfg.model_path, device
        folder = read_config(self.path)
        dtype = forward_dtype(model_cfg.dtype, device == "cpu", folder)
        self.model = (
            AutoModelForCausalLM.from_pretrained(self.path, dtype=getattr(torch, dtype))
            .to(device)
            .eval()
        )
        self.max_len: Optional[int] = folder.get("max_position_embeddings")
        log.info(
            "teacher %s on %s (%s), loaded in %.1fs",
            self.path,
            device,
            dtype,
            time.monotonic() - start,
        )

    def logprobs(self, exps: Sequence[Experience]) -> list[list[float]]:
        """The teacher's log-probs of each experience's response tokens, in input order."""
        import torch

        seqs = [list(e.prompt_ids) + list(e.response_ids) for e in exps]
        for exp, seq in zip(exps, seqs):
            if self.max_len and len(seq) > self.max_len:
                raise DataError(
                    f"experience {exp.experience_id}: {len(seq)} tokens exceed the teacher's "
                    f"max_position_embeddings={self.max_len} ({self.path}); lower "
                    "model.max_model_len to at most that"
                )
        out: list[list[float]] = [[] for _ in seqs]
        for batch in micro_batches([len(s) for s in seqs], MAX_TOKENS_PER_BATCH):
            ids, mask = pad_right([seqs[i] for i in batch], 0)  # right padding: positions stay
            with torch.inference_mode():
                logits = self.model(
                    input_ids=torch.tensor(ids, device=self.device),  # [b, L]
                    attention_mask=torch.tensor(mask, device=self.device),
                ).logits  # [b, L, V]
            for row, i in enumerate(batch):
                exp = exps[i]
                row_ids = torch.tensor(ids[row], device=self.device)  # [L]
                picked = response_logprobs(
                    logits[row], row_ids, len(exp.prompt_ids), len(exp.response_ids)
                )  # [response tokens]
                out[i] = picked.cpu().tolist()
        return out


_LOADED: dict[tuple[str, str], Teacher] = {}  # one teacher per explorer process


def _teacher(cfg: Config) -> Teacher:
    rollout_tp = cfg.explorer.rollout_model.tensor_parallel_size
    device = scorer_device(rollout_tp, auxiliary_tp(cfg), 0, TEACHER_KEY)
    key = (str(Path(cfg.explorer.auxiliary_models[0].model_path)), device)
    if key not in _LOADED:
        _LOADED[key] = Teacher(cfg, device)
    return _LOADED[key]


def add_teacher_logprobs(cfg: Config, exps: Sequence[Experience]) -> dict[str, float]:
    """Set ``teacher_logprobs`` on each experience when the run distils with its teacher in the
    explorer (else do nothing); return the step's metrics (the teacher's time, the mean
    per-token reverse-KL estimate)."""
    if not uses_teacher(cfg) or teacher_in_trainer(cfg) or not exps:
        return {}
    start = time.monotonic()
    teacher = _teacher(cfg)
    gaps, tokens = 0.0, 0
    for exp, lps in zip(exps, teacher.logprobs(exps)):
        exp.teacher_logprobs = lps
        if exp.array_len("logprobs") == len(lps):
            gaps += sum(s - t for s, t in zip(exp.logprobs, lps))
            tokens += len(lps)
    return {TEACHER_TIME_S: time.monotonic() - start, TEACHER_KL: gaps / max(tokens, 1)}
