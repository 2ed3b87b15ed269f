"""``model.external_model`` in mode bench against a real HTTP server: a scripted
OpenAI-compatible endpoint (the external service; the subject is rft's client side) that adds the
two numbers of each question and answers wrong when the first is odd. The bench's accuracy,
lengths (the endpoint's usage counts), requests, table and metrics file; and its errors."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rft.config.external import check_external_mode, external_endpoint
from rft.config.load import config_from_dict
from rft.errors import ConfigError, RftError
from rft.explorer.bench import run_bench
from rft.explorer.endpoint_client import request_args
from rft.workflow import Workflow

MODEL = "scripted-model"
KEY = "sk-test"


class Scripted(BaseHTTPRequestHandler):
    requests: list[dict] = []  # every chat request body, with its Authorization header

    def log_message(self, *args):  # quiet
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            return self._send(401, {"error": {"message": "bad key"}})
        self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Scripted.requests.append({**body, "auth": self.headers.get("Authorization")})
        if self.path != "/v1/chat/completions":
            return self._send(404, {"error": {"message": self.path}})
        question = body["messages"][-1]["content"]
        a, b = map(int, re.findall(r"(\d+) \+ (\d+)", question)[0])
        answer = a + b + (a % 2)  # right when a is even
        text = f"{a} plus {b} is \\boxed{{{answer}}}"
        self._send(
            200,
            {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14},
            },
        )


@pytest.fixture
def server():
    Scripted.requests = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


class AddWorkflow(Workflow):
    """A workflow class: one chat call per run, reward 1 for the right sum."""

    def run(self):
        a, b = self.task.raw_task["a"], self.task.raw_task["b"]
        reply = self.model.chat([{"role": "user", "content": f"What is {a} + {b}?"}])[0]
        reply.reward = float(f"\\boxed{{{a + b}}}" in reply.response_text)
        return [reply]


def config(tmp_path, workflow: str = "math_boxed_workflow", **model) -> dict:
    data = tmp_path / "adds"
    data.mkdir(exist_ok=True)
    rows = [{"question": f"What is {a} + {b}?", "answer": f"#### {a + b}", "a": a, "b": b}
            for a, b in [(2, 3), (1, 1), (4, 4), (3, 7)]]  # fmt: skip
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {
        "mode": "bench",
        "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "model": {
            "model_path": MODEL,
            "max_response_tokens": 64,
            "external_model": {"enable": True, "model_name": MODEL, **model},
        },
        "buffer": {
            "explorer_input": {
                "eval_tasksets": [
                    {
                        "name": "adds",
                        "path": str(data),
                        "split": "test",
                        "repeat_times": 2,
                        "format": {"prompt_key": "question", "response_key": "answer"},
                        "default_workflow_type": workflow,
                    }
                ]
            }
        },
        "monitor": {"monitor_type": "tensorboard"},
    }


def test_a_recipe_taskset_is_scored_from_the_endpoints_replies(tmp_path, server, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", server)  # without /v1: appended, as Trinity
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    cfg = config_from_dict(config(tmp_path))
    table = run_bench(cfg)
    row = next(line for line in table.splitlines() if line.startswith("external:"))
    # accuracy 0.5 (rows with an even first number), pass@2 0.5, length: 5 tokens (usage)
    assert row.split()[1:] == [MODEL, "adds", "0.500", "0.500", "0.500", "5.0"]
    chats = [r for r in Scripted.requests if "messages" in r]
    assert len(chats) == 8  # 4 tasks x repeat_times 2, one request per sample
    assert {r["model"] for r in chats} == {MODEL}
    assert {r["auth"] for r in chats} == {f"Bearer {KEY}"}
    assert {r["max_completion_tokens"] for r in chats} == {64}
    assert all("n" not in r and "logprobs" not in r for r in chats)
    lines = (cfg.run_dir / "monitor" / "bench" / "metrics.jsonl").read_text().splitlines()
    logged = json.loads(lines[-1])
    assert logged["eval/adds/mean@2"] == 0.5 and logged["eval/adds/failed_runs"] == 0


def test_a_workflow_class_runs_its_episodes_on_the_endpoint(tmp_path, server, monkeypatch):
    monkeypatch.setenv("MY_URL", server + "/v1/")
    monkeypatch.setenv("MY_KEY", KEY)
    raw = config(
        tmp_path,
        workflow="tests.test_external_model:AddWorkflow",
        base_url_env="MY_URL",
        api_key_env="MY_KEY",
    )
    raw["buffer"]["explorer_input"]["eval_tasksets"][0]["format"] = {}
    cfg = config_from_dict(raw)
    row = next(line for line in run_bench(cfg).splitlines() if line.startswith("external:"))
    assert row.split()[3:6] == ["0.500", "0.500", "0.500"]
    assert len([r for r in Scripted.requests if "messages" in r]) == 8


def test_a_missing_variable_is_named_before_any_request(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    cfg = config_from_dict(config(tmp_path))
    with pytest.raises(ConfigError, match="OPENAI_BASE_URL not set"):
        run_bench(cfg)
    with pytest.raises(ConfigError, match="not an http"):
        external_endpoint(cfg, {"OPENAI_BASE_URL": "localhost:1", "OPENAI_API_KEY": "k"})
    endpoint = external_endpoint(cfg, {"OPENAI_BASE_URL": "http://h/v1/", "OPENAI_API_KEY": "k"})
    assert endpoint.base_url == "http://h/v1"


def test_an_unreachable_endpoint_or_a_refused_key_stops_the_bench(tmp_path, server, monkeypatch):
    cfg = config_from_dict(config(tmp_path))
    monkeypatch.setenv("OPENAI_API_KEY", "wrong")
    monkeypatch.setenv("OPENAI_BASE_URL", server)
    with pytest.raises(RftError, match="refused the key in \\$OPENAI_API_KEY"):
        run_bench(cfg)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9")  # discard port: nobody answers
    with pytest.raises(RftError, match="cannot reach http://127.0.0.1:9/v1"):
        run_bench(cfg)
    assert not [r for r in Scripted.requests if "messages" in r]


@pytest.mark.parametrize("mode", ["both", "explore", "train"])
def test_modes_that_train_or_explore_refuse_it(tmp_path, mode):
    cfg = config_from_dict(config(tmp_path))
    cfg.mode = mode
    with pytest.raises(ConfigError, match="external_model only evaluates: use mode bench"):
        check_external_mode(cfg)


def test_enable_without_a_model_name_is_refused_at_load(tmp_path):
    raw = config(tmp_path)
    del raw["model"]["external_model"]["model_name"]
    with pytest.raises(ConfigError, match="model.external_model.model_name is empty"):
        config_from_dict(raw)


def test_sampling_keywords_become_chat_completion_arguments():
    args = request_args(
        MODEL,
        {"n": 4, "temperature": 0.0, "max_tokens": 9, "stop": ("\n",), "top_k": -1,
         "logprobs": 0, "repetition_penalty": 1.1, "seed": 3},
    )  # fmt: skip
    assert args == {
        "model": MODEL,
        "temperature": 0.0,
        "max_completion_tokens": 9,
        "stop": ["\n"],
        "seed": 3,
        "extra_body": {"repetition_penalty": 1.1},
    }


def test_rft_run_benches_the_endpoint_with_no_model_folder(tmp_path, server, monkeypatch):
    """``rft-run`` (its dry-run checks, then the bench process) with model.external_model: no
    model folder, engine or checkpoint is looked for; the plan says what runs."""
    import yaml

    from rft.launch.cli import run_main

    monkeypatch.setenv("OPENAI_BASE_URL", f"{server}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(config(tmp_path)))
    assert run_main(["--config", str(path), "--dry-run"]) == 0
    assert run_main(["--config", str(path)]) == 0
    run_dir = config_from_dict(config(tmp_path)).run_dir
    logged = json.loads(
        (run_dir / "monitor" / "bench" / "metrics.jsonl").read_text().splitlines()[-1]
    )
    assert logged["eval/adds/mean@2"] == 0.5
