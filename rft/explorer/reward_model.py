"""Reward models: score (prompt, response) conversations with a score head, inside the explorer.

Data in: a reward model folder (``explorer.auxiliary_models[i].model_path``) and conversations:
a task's prompt messages plus the generated response as the assistant's (:func:`conversation`).
Data out: one float per conversation, in input order (:meth:`RewardModel.score`).
Must not import transformers or torch with the module: only when a model is loaded.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from rft.config.auxiliary import auxiliary_tp, forward_dtype, scoring_max_len
from rft.config.schema import Config
from rft.config.teacher import uses_teacher
from rft.errors import ConfigError, DataError
from rft.models import REWARD_MODEL, auxiliary_kinds, check_reward_model_dir, read_config
from rft.placement import scorer_gpu_index

log = logging.getLogger(__name__)

Messages = list[dict[str, str]]

MAX_TOKENS_PER_BATCH = 16384  # padded tokens per forward pass (count x longest in the batch)


# ----------------------------------------------------------------------------- pure helpers


def conversation(prompt_messages: Sequence[Mapping[str, str]], response: str) -> Messages:
    """The prompt's messages with ``response`` as the assistant's reply; a trailing assistant
    message (a workflow's ``reply_prefix``, which the model continued) is completed with it."""
    messages = [dict(m) for m in prompt_messages]
    if messages and messages[-1]["role"] == "assistant":
        messages[-1]["content"] = messages[-1]["content"] + response
        return messages
    return messages + [{"role": "assistant", "content": response}]


def keep_last(ids: Sequence[int], limit: Optional[int]) -> tuple[list[int], bool]:
    """``ids`` cut to its last ``limit`` tokens (None: no limit), and whether it was cut.
    The first tokens go: the response and the end of the prompt, where the score is read, stay."""
    if limit is None or len(ids) <= limit:
        return list(ids), False
    return list(ids[len(ids) - limit :]), True


def micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices of the sequences grouped for scoring, longest first, so that each group's padded
    size (its count x its longest) is at most ``max_tokens`` (a longer sequence goes alone)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and lengths[batches[-1][0]] * (len(batches[-1]) + 1) <= max_tokens:
            batches[-1].append(i)  # the group's first is its longest
        else:
            batches.append([i])
    return batches


def pad_right(
    seqs: Sequence[Sequence[int]], pad_id: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids padded on the right with ``pad_id``, and the attention mask (1: a real token).
    Right padding: the positions of the real tokens do not move, so each score is exactly the
    conversation's alone."""
    width = max((len(s) for s in seqs), default=0)
    ids = [list(s) + [pad_id] * (width - len(s)) for s in seqs]
    mask = [[1] * len(s) + [0] * (width - len(s)) for s in seqs]
    return ids, mask


# ----------------------------------------------------------------------------- the scorer


class RewardModel:
    """A reward model folder loaded with transformers: conversations in, one score each out.

    The folder is an HF model whose ``architectures`` name a ``*ForSequenceClassification``
    class with one label, with its own tokenizer and chat template. In ``dtype``
    (:func:`rft.config.auxiliary.forward_dtype`; unset: float32 on CPU, bfloat16 on CUDA).
    vLLM's pooling runner (``LLM(..., runner="pooling")``) is not used: transformers scores a
    step's few hundred conversations in one forward pass per micro-batch, enough next to
    generation, without a second engine's memory and start-up (a generative auxiliary model
    does get one: :class:`rft.explorer.engine.AuxiliaryEngine`).
    """

    def __init__(
        self,
        path: Path | str,
        *,
        device: str = "cpu",
        max_model_len: Optional[int] = None,
        enable_thinking: Optional[bool] = None,
        max_tokens_per_batch: int = MAX_TOKENS_PER_BATCH,
        key: str = "explorer.auxiliary_models[0].model_path",
        dtype: Optional[str] = None,
    ):
        check_reward_model_dir(path, key)  # the dry run's checks, again where it runs
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        start = time.monotonic()
        self.path, self.key, self.device = str(path), key, device
        self.enable_thinking = enable_thinking
        self.max_tokens_per_batch = max_tokens_per_batch
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        if not self.tokenizer.chat_template:
            raise DataError(
                f"{key}={self.path!r}: its tokenizer has no chat template; copy "
                "chat_template.jinja from the reward model's release into the folder"
            )
        self.pad_id = _pad_id(self.tokenizer, self.path)
        dtype = getattr(torch, forward_dtype(dtype, device == "cpu", read_config(self.path, key)))
        model = AutoModelForSequenceClassification.from_pretrained(self.path, dtype=dtype)
        if model.config.num_labels != 1:
            raise ConfigError(
                f"{key}={self.path!r}: the score head has {model.config.num_labels} "
                "labels; a reward model has one (num_labels 1)"
            )
        # transformers finds each sequence's last real token by this id (its rule for reading a
        # score in a padded batch): it must be the one we pad with.
        model.config.pad_token_id = self.pad_id
        model.config.get_text_config().pad_token_id = self.pad_id
        self.model = model.to(device).eval()
        position_limit = read_config(self.path, key).get("max_position_embeddings")
        # max_model_len: the scoring limit (max_model_len, else max_prompt_tokens +
        # max_response_tokens: rft.config.auxiliary.scoring_max_len), else the position limit
        limits = [n for n in (max_model_len, position_limit) if n]  # the dry run refuses 1st > 2nd
        self.max_len: Optional[int] = min(limits) if limits else None
        self.last_truncated = 0  # conversations cut in the last score() call
        log.info(
            "reward model %s on %s (%s), scoring up to %s tokens, loaded in %.1fs",
            self.path,
            device,
            str(dtype).removeprefix("torch."),
            self.max_len,
            time.monotonic() - start,
        )

    def encode(self, messages: Sequence[Mapping[str, str]]) -> tuple[list[int], bool]:
        """Token ids of a conversation in the reward model's chat template (not the policy's:
        the reward model was trained on its own), cut to its last ``max_len`` tokens; and
        whether it was cut."""
        extra = {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}
        text = self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=False, **extra
        )
        # no special tokens added: the template writes them
        return keep_last(self.tokenizer.encode(text, add_special_tokens=False), self.max_len)

    def score(self, conversations: Sequence[Sequence[Mapping[str, str]]]) -> list[float]:
        """One score per conversation (:func:`conversation`), in input order: the score head's
        output at the last token. A conversation over ``max_len`` is scored on its last tokens,
        counted (``last_truncated``, the metric ``reward_model_truncated``) and logged, never an
        error, so one long prompt does not stop a run."""
        import torch

        encoded = [self.encode(c) for c in conversations]
        self.last_truncated = sum(cut for _, cut in encoded)
        if self.last_truncated:
            log.warning(
                "%s: %d of %d conversations are longer than %d tokens; scored on their "
                "last %d tokens (raise explorer.auxiliary_models max_model_len, up to the "
                "model's max_position_embeddings)",
                self.path,
                self.last_truncated,
                len(encoded),
                self.max_len,
                self.max_len,
            )
        seqs = [ids for ids, _ in encoded]
        scores = [0.0] * len(seqs)
        # longest first, at most max_tokens_per_batch padded tokens per forward pass
        for batch in micro_batches([len(s) for s in seqs], self.max_tokens_per_batch):
            ids, mask = pad_right([seqs[i] for i in batch], self.pad_id)
            with torch.inference_mode():
                logits = self.model(
                    input_ids=torch.tensor(ids, device=self.device),  # [b, L]
                    attention_mask=torch.tensor(mask, device=self.device),
                ).logits  # [b, 1]
            for i, value in zip(batch, logits[:, 0].float().tolist()):
                scores[i] = value
        return scores


def _pad_id(tokenizer: Any, path: str) -> int:
    """The tokenizer's pad token id, else its end-of-sequence id (what reward models trained
    with a pad-less tokenizer were batched with)."""
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    if tokenizer.eos_token_id is None:
        raise DataError(
            f"{path}: the tokenizer has neither a pad nor an end-of-sequence token; "
            "set pad_token in its tokenizer_config.json"
        )
    log.info("%s: the tokenizer has no pad token; padding with its end-of-sequence token", path)
    return int(tokenizer.eos_token_id)


# ----------------------------------------------------------------------------- in an explorer


def scorer_device(rollout_tp: int, aux_tp: Sequence[int], index: int, key: str) -> str:
    """The device of reward model ``index`` in this explorer task: the first of its GPUs (after
    the engine's and the earlier auxiliary models', :func:`rft.placement.scorer_gpu_index`), or
    ``cpu`` without GPUs (it runs on the explorer's CPUs)."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    gpu = scorer_gpu_index(rollout_tp, aux_tp, index)
    visible = torch.cuda.device_count()
    if gpu >= visible:
        raise ConfigError(
            f"{key}: this explorer task sees {visible} GPU(s), but the reward model "
            f"scores on its GPU {gpu} (after the engine's {rollout_tp} and the earlier "
            f"auxiliary models'); give each explorer task {rollout_tp + sum(aux_tp)} GPUs "
            "(rft-run and rft-launch do)"
        )
    return f"cuda:{gpu}"


def load_reward_models(cfg: Config) -> list[RewardModel]:
    """One scorer per reward model among ``explorer.auxiliary_models``, in config order (none:
    empty). A generative entry (a judge) is served to workflow classes instead
    (:mod:`rft.explorer.auxiliary`); in a distillation run (``advantage_fn`` in NEEDS_TEACHER)
    the one entry is the teacher (:mod:`rft.explorer.teacher`)."""
    if uses_teacher(cfg) or not cfg.explorer.auxiliary_models:
        return []
    models = cfg.explorer.auxiliary_models
    tps, rollout_tp = auxiliary_tp(cfg), cfg.explorer.rollout_model.tensor_parallel_size
    out = []
    for i, (model, kind) in enumerate(zip(models, auxiliary_kinds(cfg))):
        if kind != REWARD_MODEL:
            continue
        key = f"explorer.auxiliary_models[{i}]"
        out.append(
            RewardModel(
                model.model_path,
                device=scorer_device(rollout_tp, tps, i, key),
                max_model_len=scoring_max_len(model),
                enable_thinking=model.enable_thinking,
                key=f"{key}.model_path",
                dtype=model.dtype,
            )
        )
    return out
