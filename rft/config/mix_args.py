"""Trinity's MIX / CHORD batch-bookkeeping ``policy_loss_fn_args``, checked against rft's values.

Trinity's MIX losses (trinity/algorithm/policy_loss_fn/{mix,chord}_policy_loss.py) take veRL's
batch sizes to scale each micro-batch's two parts; rft weighs the parts over their rows itself,
so these args have no effect (:data:`rft.config.names.MIX_BATCH_ARGS`). A mode switch that
contradicts rft's (``use_dynamic_bsz``) is an error; a stale count (an example's numbers after
the batch or GPUs changed) is warned with the value rft uses.
"""

from __future__ import annotations

import logging

from rft.config.gpus import split_gpus
from rft.config.mix import MixCounts
from rft.config.names import MIX_BATCH_ARGS
from rft.config.schema import Config
from rft.errors import ConfigError

log = logging.getLogger(__name__)

_KEY = "algorithm.policy_loss_fn_args"


def check_mix_batch_args(cfg: Config, counts: MixCounts) -> None:
    """Compare the bookkeeping args present with what rft derived; see the module docstring."""
    args = {k: v for k, v in cfg.algorithm.policy_loss_fn_args.items() if k in MIX_BATCH_ARGS}
    if not args:
        return
    trainer = cfg.trainer
    dynamic = args.get("use_dynamic_bsz")
    if dynamic is not None and bool(dynamic) != trainer.use_dynamic_bsz:
        raise ConfigError(
            f"{_KEY}.use_dynamic_bsz={dynamic} contradicts trainer.use_dynamic_bsz="
            f"{trainer.use_dynamic_bsz} (the micro-batching the loss is scaled for); set "
            "trainer.use_dynamic_bsz (the argument itself has no effect in rft)"
        )
    for key, value, ours in _derived(cfg, counts):
        if key in args and args[key] != value:
            log.warning(
                "%s.%s=%r has no effect: rft weighs the MIX parts over their rows itself, with "
                "%s=%r (Trinity would have scaled the loss by the stale value)",
                _KEY,
                key,
                args[key],
                ours,
                value,
            )
    log.info("%s: %s have no effect in rft (batch bookkeeping)", _KEY, ", ".join(sorted(args)))


def _derived(cfg: Config, counts: MixCounts) -> list[tuple[str, object, str]]:
    """(arg, rft's value, where rft's value comes from) for each count rft derives."""
    trainer, split = cfg.trainer, split_gpus(cfg)
    rows = [
        ("ppo_mini_batch_size", counts.total, "buffer.train_batch_size"),
        ("train_batch_size_usual", counts.rollout, "rollouts per step"),
        ("train_batch_size_expert", counts.expert, "expert samples per step"),
        ("repeat_times", cfg.algorithm.repeat_times, "algorithm.repeat_times"),
    ]
    if cfg.algorithm.policy_loss_fn == "mix":
        rows.pop(0)  # Trinity's mix multiplies it by repeat_times: a count of another unit
    if not trainer.use_dynamic_bsz:  # Trinity reads the micro size only without dynamic bsz
        rows.append(
            (
                "ppo_micro_batch_size_per_gpu",
                trainer.micro_batch_size_per_gpu,
                "trainer.micro_batch_size_per_gpu",
            )
        )
    if cfg.cluster.gpu_per_node and cfg.mode in ("both", "train"):
        rows.append(("ngpus_trainer", split.trainer, "the trainer's GPUs"))
    return rows
