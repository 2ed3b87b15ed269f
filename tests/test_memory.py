"""What a CPU run is expected to hold in memory (rft.launch.memory), the warning at start when
the machine has less, the dry run's memory line, and the settings that bound the trainer's
memory: one CPU trainer rank with the cores' threads on a small machine, and DeepSpeed reduce
buckets sized to the model."""

from __future__ import annotations

import json
import logging

import pytest

from rft.config.load import config_from_dict
from rft.launch import memory
from rft.launch.preflight import warn_memory
from rft.placement import cpu_trainer_threads

GB = 2**30


def model_folder(path, params=135_000_000, layers=30, hidden=576):
    """A model folder as far as the estimate reads it: config.json and a safetensors header
    (the values themselves are not read)."""
    path.mkdir(parents=True, exist_ok=True)
    config = {"num_hidden_layers": layers, "hidden_size": hidden}
    (path / "config.json").write_text(json.dumps(config))
    header = {
        "__metadata__": {"format": "pt"},
        "embed": {"dtype": "BF16", "shape": [params - 10, 1], "data_offsets": [0, 0]},
        "norm": {"dtype": "BF16", "shape": [2, 5], "data_offsets": [0, 0]},
    }
    raw = json.dumps(header).encode()
    (path / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw)
    return path


def config(tmp_path, **sections):
    base = {
        "mode": "train",  # both's processes are priced by the tests, one role each
        "checkpoint_root_dir": str(tmp_path / "ck"),
        "model": {"model_path": str(model_folder(tmp_path / "m")), "max_model_len": 512},
        "buffer": {"batch_size": 8},
        "algorithm": {"repeat_times": 4, "kl_loss_fn": "none"},
        "trainer": {"gradient_checkpointing": False},
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return config_from_dict(base)


def test_model_shape_counts_the_stored_values(tmp_path):
    shape = memory.model_shape(str(model_folder(tmp_path / "m2", params=1000)))
    assert shape == memory.ModelShape(1000, 30, 576)
    assert memory.model_shape(str(tmp_path / "missing")) is None


def test_micro_batch_tokens_is_a_steps_share_capped_by_the_budget(tmp_path):
    cfg = config(tmp_path, trainer={"max_token_len_per_gpu": 100_000})
    assert memory.micro_batch_tokens(cfg, 1) == 32 * 512  # 8 tasks x 4 runs, full length
    assert memory.micro_batch_tokens(cfg, 2) == 16 * 512
    assert memory.micro_batch_tokens(config(tmp_path, trainer={"max_token_len_per_gpu": 2048}), 1) == 2048  # fmt: skip
    fixed = config(tmp_path, trainer={"use_dynamic_bsz": False, "micro_batch_size_per_gpu": 3})
    assert memory.micro_batch_tokens(fixed, 1) == 3 * 512


def test_the_estimate_adds_runtime_weights_states_and_activations(tmp_path):
    cfg = config(tmp_path, trainer={"max_token_len_per_gpu": 2048})
    est = memory.estimate(cfg, explorers=1, ranks=2, kv_cache_gib=1.0)
    weights = 135_000_000 * 4 / GB
    assert est.explorer_gb == pytest.approx(memory.EXPLORER_RUNTIME_GB + weights + 1.0)
    activations = 2048 * 30 * 576 * memory.ACTIVATION_BYTES / GB
    states = weights * (2 + 3 / 2)  # no KL term: no reference model
    assert est.trainer_rank_gb == pytest.approx(memory.TRAINER_RUNTIME_GB + states + activations)
    assert est.total_gb == pytest.approx(memory.LAUNCHER_GB + est.explorer_gb + 2 * est.trainer_rank_gb)  # fmt: skip
    kl = memory.estimate(config(tmp_path, trainer={"max_token_len_per_gpu": 2048}, algorithm={"kl_loss_fn": "k2"}), 1, 2, 1.0)  # fmt: skip
    assert kl.trainer_rank_gb == pytest.approx(est.trainer_rank_gb + weights)  # the reference
    checkpointed = memory.estimate(config(tmp_path, trainer={"max_token_len_per_gpu": 2048, "gradient_checkpointing": True}), 1, 2, 1.0)  # fmt: skip
    assert checkpointed.trainer_rank_gb < est.trainer_rank_gb - 1.0


def test_a_cpu_run_has_one_trainer_rank_or_one_sequence_group():
    from rft.placement import local_trainer_ranks

    assert local_trainer_ranks(0, {}) == 1  # one rank with every core's threads
    assert local_trainer_ranks(0, {}, sequence_parallel=2) == 2  # the group the config asks for
    assert local_trainer_ranks(0, {"RFT_LOCAL_TRAINER_RANKS": "4"}, sequence_parallel=2) == 4
    assert local_trainer_ranks(3, {"RFT_LOCAL_TRAINER_RANKS": "4"}) == 3  # GPUs: one rank each


def test_states_follow_the_zero_stage(tmp_path):
    # ZeRO-0: weights, gradients and AdamW's two moments, whole; ZeRO-1/2 add a float32 copy
    # of the weights and split it and the moments over the ranks; ZeRO-3 splits everything
    assert memory.states_gb(1.0, 0, 1) == pytest.approx(4.0)
    assert memory.states_gb(1.0, 2, 1) == pytest.approx(5.0)
    assert memory.states_gb(1.0, 2, 2) == pytest.approx(3.5)
    assert memory.states_gb(1.0, 3, 2) == pytest.approx(2.5)
    stage0 = memory.estimate(config(tmp_path, trainer={"zero_stage": 0}), 1, 1, 1.0)
    stage2 = memory.estimate(config(tmp_path), 1, 1, 1.0)
    weights = 135_000_000 * 4 / GB
    assert stage2.trainer_rank_gb - stage0.trainer_rank_gb == pytest.approx(weights)


def test_the_warning_names_the_keys_that_lower_memory(tmp_path):
    est = memory.estimate(config(tmp_path), explorers=1, ranks=1, kv_cache_gib=1.0)
    assert memory.warning(est, est.total_gb + 0.1) is None
    text = memory.warning(est, 4.0)
    assert f"up to about {est.total_gb:.1f} GB" in text and "4.0 GB available" in text
    for key in ("trainer.max_token_len_per_gpu", "trainer.gradient_checkpointing", "RFT_LOCAL_TRAINER_RANKS", "trainer.zero_stage", "VLLM_CPU_KVCACHE_SPACE"):  # fmt: skip
        assert key in text


def test_available_memory_is_read_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       25165824 kB\nMemAvailable:   12582912 kB\n")
    assert memory.available_gb(meminfo) == pytest.approx(12.0)
    assert memory.available_gb(tmp_path / "none") is None


def test_a_run_start_warns_when_the_machine_is_short(tmp_path, monkeypatch, caplog):
    cfg = config(tmp_path)
    monkeypatch.setattr(memory, "available_gb", lambda: 1.0)
    with caplog.at_level(logging.WARNING):
        warn_memory(cfg)
    assert "1.0 GB available" in caplog.text and "OOM" in caplog.text
    caplog.clear()
    monkeypatch.setattr(memory, "available_gb", lambda: 1000.0)
    with caplog.at_level(logging.WARNING):
        warn_memory(cfg)
    assert caplog.text == ""


def test_cpu_trainer_ranks_share_the_cores_as_threads():
    assert cpu_trainer_threads(1, cores=2) == 2 and cpu_trainer_threads(2, cores=2) == 1
    assert cpu_trainer_threads(2, cores=16) == 8 and cpu_trainer_threads(4, cores=2) == 1


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_reduce_buckets_are_sized_to_the_model(tmp_path, stage):
    """DeepSpeed's default reduce bucket (5e8 elements) is a buffer as large as a small
    model's gradient: rft sets hidden^2 elements (transformers' "auto"), at least 2^25."""
    from rft.trainer.engine import MIN_REDUCE_BUCKET, ds_config

    cfg = config(tmp_path, trainer={"zero_stage": stage})
    assert ds_config(cfg, 2, True)["zero_optimization"]["reduce_bucket_size"] == MIN_REDUCE_BUCKET
    wide = config(tmp_path, model={"model_path": str(model_folder(tmp_path / "w", params=10, hidden=8192))})  # fmt: skip
    assert ds_config(wide, 2, True)["zero_optimization"]["reduce_bucket_size"] == 8192 * 8192


def test_the_dry_run_shows_the_runs_memory_on_a_machine_without_gpus(vllm_model_dir):
    import re

    from rft.config.load import load_config
    from rft.launch.cli import dry_run
    from tests.helpers.dry_run import CPU_CONFIG, overrides

    text = dry_run(load_config(CPU_CONFIG, overrides(vllm_model_dir)), str(CPU_CONFIG))
    line = next(line for line in text.splitlines() if line.strip().startswith("memory "))
    assert re.search(r"up to about [\d.]+ GB, 1 vLLM process\(es\) x [\d.]+, \d trainer rank\(s\) x [\d.]+ \(micro-batches of up to \d+ tokens\); [\d.]+ GB available", line), line  # fmt: skip


def test_the_benchmarks_memory_sampler_sums_a_process_tree(tmp_path):
    """benchmarks.common.sample_memory: a parent and the child it starts, the child holding
    300 MB of its own pages: the summed peak (PSS and RSS) counts them, under the child's role."""
    import subprocess
    import sys
    import time

    from benchmarks.common import sample_memory

    code = (
        "import subprocess, sys, time\n"
        "child = 'x = bytearray(300 * 2**20); import time; time.sleep(4)'\n"
        "subprocess.run([sys.executable, '-c', child])\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    with sample_memory(parent.pid, interval_s=0.2, pss_every=2) as peak:
        parent.wait(timeout=60)
        time.sleep(0.1)
    assert peak.summed_gb >= 0.28 and peak.summed_rss_gb >= peak.summed_gb * 0.9
    assert max(peak.by_role_gb.values()) >= 0.28
