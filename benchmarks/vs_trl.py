"""rft against TRL's ``GRPOTrainer``: the same GRPO run through both, printed side by side.

Input: an rft config (synchronous GRPO, ``mode: both``), read with rft's own loader, plus
``--steps``/``--seed`` and ``key=value`` overrides. From it both sides take the same model,
training tasks in the same order (rft's task stream: TRL's dataset is the first
``steps x batch_size`` tasks, unshuffled), the same prompt token ids (the workflow's chat
messages rendered as the explorer renders them; checked token for token), the same reward
function (the workflow's, wrapped for TRL), and the same GRPO hyper-parameters: group size,
tasks per step, mini-batches per step, lr/AdamW/schedule, response tokens, sampling, KL,
clip range, epochs per batch, loss aggregation, gradient clipping and checkpointing. Both
train in float32 (this benchmark overrides ``trainer.precision=fp32`` and the rollout dtype).

Runs, in order, each writing under ``--out`` only:

1. rft: ``bin/rft-run --config C [overrides]`` (one vLLM CPU explorer + the DeepSpeed trainer),
   metrics from ``<run_dir>/monitor/{trainer,explorer_<name>}/metrics.jsonl``;
2. TRL: ``GRPOTrainer`` in this process on the CPU (``use_cpu``), its generation through
   transformers' ``generate`` or, with ``--trl-generation vllm``, its colocated vLLM; step
   times from a ``TrainerCallback``, generated tokens and rewards recorded as they happen;
   the final model saved with ``trainer.save_model``;
3. held-out accuracy of the starting model, rft's final model and TRL's final model: rft's
   ``mode=bench`` (the eval tasksets with their own rollout_args, the same code for all three).

Output: a table (wall time per step, steps 2..N: step 1 is warm-up and left out; generated
tokens/s; reward per step; held-out accuracy after N steps; TRL time/step / rft time/step),
the per-step rewards, what differs between the two implementations, and ``summary.json``.
Usage (TRL is not an rft dependency: ``.venv/bin/pip install -r benchmarks/requirements-bench.txt``)::

    flock /tmp/rft-heavy.lock .venv/bin/python -m benchmarks.vs_trl --steps 6 --seed 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchmarks.common import REPO, run_recorded
from rft.config import batches
from rft.config.load import load_config
from rft.config.schema import Config
from rft.explorer import tasksets as T
from rft.explorer.open_steps import accuracy_of
from rft.monitor import ACCURACY, POLICY_LOSS, REWARD_MEAN, read_metrics
from rft.rundir import explorer_role
from rft.workflow.rewards import total_reward

BENCH_REQUIREMENTS = REPO / "benchmarks" / "requirements-bench.txt"
RFT_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TORCH_EXTENSIONS_DIR": str(REPO / ".cache" / "torch_extensions"),
}
TRL_LOSS_TYPES = {"token-mean": "dapo", "seq-mean-token-mean": "grpo"}  # rft agg -> TRL loss_type


class BenchError(Exception):
    """A setting this comparison cannot reproduce in TRL, or a failed run."""


# ----------------------------------------------------------------------------- shared settings


@dataclass(frozen=True)
class Hyper:
    """The GRPO settings both sides run with (from the rft config)."""

    model_path: str
    steps: int
    tasks_per_step: int  # buffer.batch_size
    group_size: int  # algorithm.repeat_times = TRL num_generations
    updates_per_step: int  # mini-batches per step (buffer.train_batch_size)
    rollouts_per_update: int
    epochs_per_batch: int  # trainer.ppo_epochs = TRL num_iterations
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    lr_schedule: str  # constant | cosine
    warmup_steps: int  # in rft steps
    min_lr_ratio: float
    max_response_tokens: int
    temperature: float
    top_p: float
    top_k: int  # -1: off
    kl_fn: str  # none | k1 | k2 | k3 | low_var_kl | abs
    kl_coef: float
    clip_low: float
    clip_high: float
    dual_clip: float | None  # rft's clip_ratio_c; TRL has no dual clip
    std_normalize: bool  # advantages / group std (TRL scale_rewards "group", else "none")
    loss_agg_mode: str
    grad_clip: float
    gradient_checkpointing: bool
    max_model_len: int | None
    seed: int


def hyper_parameters(cfg: Config, seed: int) -> Hyper:
    """The settings of ``cfg`` both sides share; BenchError for what TRL cannot run alike."""
    algo, opt = cfg.algorithm, cfg.algorithm.optimizer
    if cfg.stages:
        raise BenchError("configs with stages: are not supported; benchmark one GRPO stage")
    if cfg.mode != "both" or algo.algorithm_type != "grpo":
        raise BenchError(
            f"need mode both and algorithm_type grpo, got {cfg.mode}/{algo.algorithm_type}"
        )
    if algo.advantage_fn != "grpo" or algo.policy_loss_fn != "ppo":
        raise BenchError("TRL's GRPOTrainer has GRPO advantages with the PPO clipped loss only")
    if (algo.kl_penalty_fn or "none") != "none" or (algo.entropy_loss_fn or "none") != "none":
        raise BenchError("KL reward penalty and entropy bonus are not mapped to TRL")
    if algo.loss_agg_mode not in TRL_LOSS_TYPES:
        raise BenchError(f"loss_agg_mode {algo.loss_agg_mode!r}: TRL has {list(TRL_LOSS_TYPES)}")
    train_sets = cfg.training_tasksets()
    sampling = {T.sampling_args(cfg, ts) for ts in train_sets}
    if len(sampling) != 1:
        raise BenchError("the training tasksets sample differently; TRL has one setting")
    s = sampling.pop()
    if s.n != algo.repeat_times:
        raise BenchError("taskset repeat_times differs from algorithm.repeat_times")
    kl_fn = algo.kl_loss_fn or "none"
    pargs = algo.policy_loss_fn_args
    clip = pargs.get("clip_range", 0.2)
    steps = T.TaskStream(
        T.training_tasksets(cfg),
        cfg.buffer.batch_size,
        cfg.buffer.total_epochs,
        cfg.buffer.total_steps,
    ).total_steps
    return Hyper(
        model_path=str(Path(cfg.model.model_path).absolute()),
        steps=steps,
        tasks_per_step=cfg.buffer.batch_size,
        group_size=algo.repeat_times,
        updates_per_step=batches.mini_batches_per_step(cfg),
        rollouts_per_update=batches.rollouts_per_update(cfg),
        epochs_per_batch=cfg.trainer.ppo_epochs,
        lr=opt.lr,
        betas=(opt.betas[0], opt.betas[1]),
        weight_decay=opt.weight_decay,
        lr_schedule=opt.warmup_style,
        warmup_steps=opt.lr_warmup_steps
        if opt.lr_warmup_steps >= 0
        else round(opt.lr_warmup_steps_ratio * steps),
        min_lr_ratio=opt.min_lr_ratio,
        max_response_tokens=s.max_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        kl_fn=kl_fn,
        kl_coef=float(algo.kl_loss_fn_args.get("kl_coef", 0.001)) if kl_fn != "none" else 0.0,
        clip_low=float(pargs.get("clip_range_low") or clip),
        clip_high=float(pargs.get("clip_range_high") or clip),
        dual_clip=pargs.get("clip_ratio_c", 3.0),
        std_normalize=bool(algo.advantage_fn_args.get("std_normalize", True)),
        loss_agg_mode=algo.loss_agg_mode,
        grad_clip=cfg.trainer.grad_clip,
        gradient_checkpointing=cfg.trainer.gradient_checkpointing,
        max_model_len=cfg.explorer.rollout_model.max_model_len or cfg.model.max_model_len,
        seed=seed,
    )


def differences(h: Hyper, generation: str) -> list[str]:
    """What the two implementations do differently with the same settings (printed)."""
    out = [
        f"generation: rft vLLM (CPU) in its own explorer process, TRL {generation} in the "
        "training process, one after the other"
    ]
    if h.kl_fn not in ("none", "k3"):
        out.append(f"KL estimator: rft {h.kl_fn}, TRL k3 (its only one), both coef {h.kl_coef}")
    if h.std_normalize:
        out.append(
            "advantages: both (r - group mean) / (unbiased group std + eps), eps rft 1e-6, TRL 1e-4"
        )
    if h.dual_clip is not None:
        out.append(
            f"PPO loss: rft adds the dual clip (clip_ratio_c {h.dual_clip}) for negative "
            "advantages; TRL has none"
        )
    out.append(
        "trainer: rft DeepSpeed ZeRO (gloo on CPU), token-budget micro-batches; TRL "
        "accelerate, one forward per mini-batch"
    )
    return out


# ----------------------------------------------------------------------------- the same tasks


@dataclass
class TaskRow:
    prompt: str  # the rendered chat prompt (TRL tokenizes it to the explorer's ids)
    truth: str
    reply_prefix: str
    taskset: int


def step_tasks(cfg: Config, tokenizer: Any, steps: int) -> list[TaskRow]:
    """rft's first ``steps`` batches of training tasks, as TRL dataset rows, in order."""
    train_sets = T.training_tasksets(cfg)
    stream = T.TaskStream(
        train_sets, cfg.buffer.batch_size, cfg.buffer.total_epochs, cfg.buffer.total_steps
    )
    cursor, rows = stream.new_cursor(), []
    limit = T.prompt_token_limit(cfg)
    thinking = (
        cfg.model.enable_thinking
        if cfg.model.enable_thinking is not None
        else cfg.explorer.rollout_model.enable_thinking
    )  # as the explorer renders prompts
    for _ in range(steps):
        for task in stream.next_batch(cursor):
            ts = train_sets[task.taskset]
            row, fmt = ts.rows[task.index], ts.config.format
            ids = T.prompt_ids(
                tokenizer,
                ts.workflow.build_messages(row, fmt),
                reply_prefix=fmt.reply_prefix,
                chat_template=cfg.model.custom_chat_template,
                enable_thinking=thinking,
            )
            text = tokenizer.decode(ids)
            if tokenizer(text)["input_ids"] != ids:
                raise BenchError(
                    f"task {task}: the rendered prompt does not re-tokenize to the "
                    "explorer's ids; TRL would see another prompt"
                )
            if limit is not None and len(ids) > limit:
                raise BenchError(f"task {task}: prompt of {len(ids)} tokens is over {limit}")
            rows.append(
                TaskRow(
                    text, ts.workflow.ground_truth(row, fmt), fmt.reply_prefix or "", task.taskset
                )
            )
    if len(rows) != steps * cfg.buffer.batch_size:
        raise BenchError(f"the taskset gives {len(rows)} tasks, not {steps} full steps")
    return rows


# ----------------------------------------------------------------------------- TRL


def import_trl() -> Any:
    try:
        import trl
    except ImportError as e:
        pin = next(
            line.split()[0]
            for line in BENCH_REQUIREMENTS.read_text().splitlines()
            if line.startswith("trl==")
        )
        raise BenchError(
            f"TRL is not installed: .venv/bin/pip install {pin} "
            f"(or -r {BENCH_REQUIREMENTS.relative_to(REPO)})"
        ) from e
    return trl


def run_trl(cfg: Config, h: Hyper, out: Path, generation: str) -> dict[str, Any]:
    """Train with TRL's GRPOTrainer; returns per-step times, tokens, rewards and the model path."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    trl = import_trl()
    if generation == "vllm":
        colocated_vllm_like_rft(cfg)
    torch.manual_seed(h.seed)
    start = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(h.model_path)
    rows = step_tasks(cfg, tokenizer, h.steps)
    train_sets = T.training_tasksets(cfg)
    rewards: list[tuple[list[float], list[float]]] = []  # per generation: rewards, accuracies

    def rft_reward(
        completions: list[str],
        truth: list[str],
        reply_prefix: list[str],
        taskset: list[int],
        **_: Any,
    ) -> list[float]:
        parts = [
            train_sets[i].workflow.score(c, t, p or None)
            for c, t, p, i in zip(completions, truth, reply_prefix, taskset)
        ]
        totals = [total_reward(x) for x in parts]
        rewards.append(
            (
                totals,
                [
                    accuracy_of(SimpleNamespace(reward_parts=x, reward=r))
                    for x, r in zip(parts, totals)
                ],
            )
        )
        return totals

    updates = h.updates_per_step * h.epochs_per_batch  # TRL optimizer steps per rft step
    args = trl.GRPOConfig(
        output_dir=str(out / "trl"),
        max_steps=h.steps * updates,
        seed=h.seed,
        use_cpu=True,
        bf16=False,
        fp16=False,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        per_device_train_batch_size=h.rollouts_per_update,
        steps_per_generation=h.updates_per_step,
        gradient_accumulation_steps=1,
        num_generations=h.group_size,
        num_iterations=h.epochs_per_batch,
        shuffle_dataset=False,
        max_completion_length=h.max_response_tokens,
        temperature=h.temperature,
        top_p=h.top_p,
        top_k=max(h.top_k, 0),
        learning_rate=h.lr,
        adam_beta1=h.betas[0],
        adam_beta2=h.betas[1],
        weight_decay=h.weight_decay,
        lr_scheduler_type="constant_with_warmup"
        if h.lr_schedule == "constant"
        else "cosine_with_min_lr",
        lr_scheduler_kwargs={} if h.lr_schedule == "constant" else {"min_lr_rate": h.min_lr_ratio},
        warmup_steps=h.warmup_steps * updates,
        max_grad_norm=h.grad_clip,
        beta=h.kl_coef,
        epsilon=h.clip_low,
        epsilon_high=h.clip_high,
        scale_rewards="group" if h.std_normalize else "none",
        loss_type=TRL_LOSS_TYPES[h.loss_agg_mode],
        gradient_checkpointing=h.gradient_checkpointing,
        use_vllm=generation == "vllm",
        vllm_mode="colocate",
        vllm_max_model_length=h.max_model_len,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    model = AutoModelForCausalLM.from_pretrained(h.model_path, dtype=torch.float32)
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[rft_reward],
        args=args,
        train_dataset=Dataset.from_list([asdict(r) for r in rows]),
        processing_class=tokenizer,
    )
    step_ends: list[float] = []
    generated: list[tuple[int, float]] = []  # per generation: tokens, seconds

    class StepTimer(TrainerCallback):
        def on_train_begin(self, *_: Any, **__: Any) -> None:
            step_ends.append(time.monotonic())

        def on_step_end(self, *_: Any, **__: Any) -> None:
            step_ends.append(time.monotonic())

    trainer.add_callback(StepTimer())
    time_generation(trainer, generation, generated)
    trainer.train()
    trainer.save_model(str(out / "trl" / "model"))
    ends = step_ends[::updates] if updates > 1 else step_ends  # rft-step boundaries
    result = {
        "step_s": [b - a for a, b in zip(ends, ends[1:])],
        "tokens": [n for n, _ in generated],
        "generate_s": [s for _, s in generated],
        "reward": [statistics.fmean(r) for r, _ in rewards],
        "accuracy": [statistics.fmean(a) for _, a in rewards],
        "total_s": time.monotonic() - start,
        "model": str(out / "trl" / "model"),
    }
    del trainer, model
    return result


def colocated_vllm_like_rft(cfg: Config) -> None:
    """TRL's colocated ``LLM(...)`` with rft's rollout dtype and CPU KV cache (TRL passes neither)."""
    import functools

    from trl.generation import vllm_generation

    from rft.explorer import engine

    engine.set_cpu_env_defaults()
    vllm_generation.LLM = functools.partial(
        vllm_generation.LLM, dtype=cfg.explorer.rollout_model.dtype
    )


def time_generation(trainer: Any, generation: str, record: list[tuple[int, float]]) -> None:
    """Record (generated tokens, seconds) of each generation call of ``trainer``: vLLM's
    generate (not its weight sync), or the transformers path's ``_generate_single_turn``."""
    owner, name, ids_at = (
        (trainer.vllm_generation, "generate", 1)
        if generation == "vllm"
        else (trainer, "_generate_single_turn", 0)
    )
    inner = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        out = inner(*args, **kwargs)
        record.append((sum(len(c) for c in out[ids_at]), time.monotonic() - start))
        return out

    setattr(owner, name, timed)


# ----------------------------------------------------------------------------- rft


def rft_run(config: str, overrides: list[str], log_path: Path) -> float:
    """``bin/rft-run`` with ``overrides``, output to ``log_path``; returns its wall seconds."""
    cmd = [sys.executable, str(REPO / "bin" / "rft-run"), "--config", config, *overrides]
    print(f"  $ {' '.join(cmd[1:])}  (log: {log_path})", flush=True)
    start = time.monotonic()
    with open(log_path, "w") as log:
        rc = subprocess.call(
            cmd,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **{k: os.environ.get(k, v) for k, v in RFT_ENV.items()}},
        )
    if rc != 0:
        tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-30:])
        raise BenchError(f"rft-run exited with {rc}; last lines of {log_path}:\n{tail}")
    return time.monotonic() - start


def rft_results(cfg: Config) -> dict[str, Any]:
    """Per-step times (between trainer step ends), generation and rewards from the metrics."""
    trainer = [r for r in read_metrics(cfg.run_dir, "trainer") if "time" in r and POLICY_LOSS in r]
    explorer = [
        r
        for r in read_metrics(cfg.run_dir, explorer_role(cfg.explorer.name, 0))
        if REWARD_MEAN in r
    ]
    times = [r["time"] for r in sorted(trainer, key=lambda r: r["step"])]
    explorer.sort(key=lambda r: r["step"])
    return {
        "step_s": [b - a for a, b in zip(times, times[1:])],
        "first_step_s": trainer[0].get("time/step_s") if trainer else None,
        "tokens": [r["generated_tokens"] for r in explorer],
        "generate_s": [r["generate_time_s"] for r in explorer],
        "reward": [r[REWARD_MEAN] for r in explorer],
        "accuracy": [r.get(ACCURACY) for r in explorer],
    }


def bench(config: str, overrides: list[str], out: Path, label: str) -> dict[int, dict[str, float]]:
    """rft ``mode=bench`` -> {step: {eval/<taskset>/mean@k: accuracy}} (step 0: the base)."""
    rft_run(
        config,
        [*overrides, "mode=bench", "explorer.bench_on_latest_checkpoint=true"],
        out / f"bench-{label}.log",
    )
    cfg = load_config(config, [*overrides, "mode=bench"])
    return {
        r["step"]: {k: v for k, v in r.items() if k.startswith("eval/") and "/mean@" in k}
        for r in read_metrics(cfg.run_dir, "bench")
    }


# ----------------------------------------------------------------------------- report


def mean_after_first(values: list[float]) -> float:
    return statistics.fmean(values[1:]) if len(values) > 1 else float("nan")


def table(
    h: Hyper, trl: dict[str, Any], rft: dict[str, Any], held: dict[str, dict[str, float]]
) -> str:
    """The side-by-side table; ``trl``/``rft`` per-step series, ``held`` label -> accuracies."""
    trl_step = statistics.fmean(trl["step_s"][1:]) if len(trl["step_s"]) > 1 else float("nan")
    rft_step = statistics.fmean(rft["step_s"]) if rft["step_s"] else float("nan")
    rows = [
        ("wall time per step, s (steps 2..N)", trl_step, rft_step),
        (
            "generated tokens/s of step wall time",
            sum(trl["tokens"][1:]) / sum(trl["step_s"][1:])
            if len(trl["step_s"]) > 1
            else float("nan"),
            sum(rft["tokens"][1:]) / sum(rft["step_s"]) if rft["step_s"] else float("nan"),
        ),
        (
            "generated tokens/s while generating",
            sum(trl["tokens"][1:]) / sum(trl["generate_s"][1:])
            if len(trl["tokens"]) > 1
            else float("nan"),
            sum(rft["tokens"][1:]) / sum(rft["generate_s"][1:])
            if len(rft["tokens"]) > 1
            else float("nan"),
        ),
        (
            "generated tokens per step (mean)",
            statistics.fmean(trl["tokens"]),
            statistics.fmean(rft["tokens"]),
        ),
        ("total wall time, s (start-up included)", trl["total_s"], rft["total_s"]),
        (
            "train reward, mean of all steps",
            statistics.fmean(trl["reward"]),
            statistics.fmean(rft["reward"]),
        ),
    ]
    for key in sorted({k for v in held.values() for k in v}):
        rows.append(
            (
                f"held-out {key.split('/')[1]} {key.split('/')[2]} after {h.steps} steps",
                held["trl"].get(key, float("nan")),
                held["rft"].get(key, float("nan")),
            )
        )
    lines = [f"{'':<46} {'TRL':>12} {'rft':>12}"]
    lines += [f"{name:<46} {a:>12.3f} {b:>12.3f}" for name, a, b in rows]
    if held["base"]:
        lines.append(
            "held-out accuracy of the starting model: "
            + ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in sorted(held["base"].items()))
        )
    lines.append(f"TRL time/step / rft time/step: {trl_step / rft_step:.2f}x")
    lines.append("")
    lines.append(
        f"{'step':>4} {'TRL s':>8} {'rft s':>8} {'TRL reward':>11} {'rft reward':>11} "
        f"{'TRL acc':>8} {'rft acc':>8}"
    )
    trl_s, rft_s = trl["step_s"], [rft["first_step_s"], *rft["step_s"]]
    for i in range(h.steps):
        get = lambda xs: xs[i] if i < len(xs) and xs[i] is not None else float("nan")  # noqa: E731
        lines.append(
            f"{i + 1:>4} {get(trl_s):>8.1f} {get(rft_s):>8.1f} {get(trl['reward']):>11.3f} "
            f"{get(rft['reward']):>11.3f} {get(trl['accuracy']):>8.3f} {get(rft['accuracy']):>8.3f}"
        )
    lines.append(
        "step 1 (s): TRL from train start, rft its trainer's time/step_s (warm-up; not in the mean)"
    )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/quickstart_cpu.yaml")
    parser.add_argument(
        "--steps", type=int, default=None, help="buffer.total_steps (default: the config's)"
    )
    parser.add_argument(
        "--seed", type=int, default=42, help="TRL's seed and the rollout seed of rft"
    )
    parser.add_argument(
        "--out", default=None, help="empty folder for everything written (default: a temp dir)"
    )
    parser.add_argument(
        "--trl-generation",
        choices=["transformers", "vllm"],
        default="transformers",
        help="TRL's generation path (vllm: its colocated vLLM, with rft's rollout dtype)",
    )
    parser.add_argument(
        "overrides", nargs="*", help="key=value overrides of the config (both sides)"
    )
    args = parser.parse_args()
    import_trl()  # before minutes of rft: say how to install it
    out = Path(args.out or tempfile.mkdtemp(prefix="vs_trl-")).absolute()
    if out.exists() and any(out.iterdir()):
        raise BenchError(f"--out {out} is not empty")
    out.mkdir(parents=True, exist_ok=True)
    config = str(Path(args.config).absolute())
    overrides = [
        *args.overrides,
        *([f"buffer.total_steps={args.steps}"] if args.steps else []),
        f"checkpoint_root_dir={out / 'rft'}",
        f"explorer.rollout_model.seed={args.seed}",
        "trainer.precision=fp32",
        "explorer.rollout_model.dtype=float32",
        "explorer.eval_interval=0",
        "explorer.eval_on_startup=false",
        "monitor.monitor_type=console",
    ]
    cfg = load_config(config, overrides)
    h = hyper_parameters(cfg, args.seed)
    print(
        f"vs_trl: {args.config}, {h.steps} steps x {h.tasks_per_step} tasks x {h.group_size} samples, "
        f"seed {args.seed}; out {out}"
    )
    print("settings: " + json.dumps(asdict(h)))
    print(
        f"rft overrides (training; held-out accuracy by mode=bench afterwards): {' '.join(overrides)}"
    )

    print(f"[1/4] rft-run (load {os.getloadavg()[0]:.1f})", flush=True)
    rft_total = rft_run(config, overrides, out / "rft-train.log")
    rft = {**rft_results(cfg), "total_s": rft_total}
    print(
        f"[2/4] TRL GRPOTrainer, generation: {args.trl_generation} (load {os.getloadavg()[0]:.1f})",
        flush=True,
    )
    trl = run_trl(cfg, h, out, args.trl_generation)
    print(
        f"[3/4] bench: starting model and rft's final model (load {os.getloadavg()[0]:.1f})",
        flush=True,
    )
    rft_held = bench(config, overrides, out, "rft")
    print(f"[4/4] bench: TRL's final model (load {os.getloadavg()[0]:.1f})", flush=True)
    trl_held = bench(
        config,
        [
            *overrides,
            f"model.model_path={trl['model']}",
            f"checkpoint_root_dir={out / 'trl-bench'}",
        ],
        out,
        "trl",
    )
    held = {
        "base": rft_held.get(0, {}),
        "rft": rft_held.get(max(rft_held), {}) if rft_held else {},
        "trl": trl_held.get(0, {}),
    }
    import trl as trl_pkg

    print()
    print(
        f"TRL {trl_pkg.__version__} GRPOTrainer (generation: {args.trl_generation}"
        f"{' model.generate' if args.trl_generation == 'transformers' else ' colocated'}, CPU) vs "
        f"rft (vLLM CPU explorer + DeepSpeed trainer, 2 processes), {h.steps} steps, seed {args.seed}, fp32"
    )
    print(table(h, trl, rft, held))
    print("differences: " + "; ".join(differences(h, args.trl_generation)))
    summary = {
        "settings": asdict(h),
        "trl": trl,
        "rft": rft,
        "held_out": held,
        "trl_generation": args.trl_generation,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"written: {out / 'summary.json'}; logs and models under {out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(run_recorded("vs_trl", main))
    except BenchError as e:
        print(f"vs_trl: {e}", file=sys.stderr)
        sys.exit(2)
