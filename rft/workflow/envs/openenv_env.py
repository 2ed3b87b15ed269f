"""``openenv_env``: an OpenEnv environment (PyPI ``openenv-core``) played by the model through
``reset``/``step``, one observation a user message and one reply an action per turn.

``workflow_args`` name the environment: ``env``, an ``openenv`` ``Environment`` subclass
(``pkg.module:Class``) built with ``env_kwargs`` and run in this process, one instance per
episode; or ``base_url``, a running OpenEnv server (``uvicorn pkg.module:app``), one WebSocket
session per episode through ``client`` (an ``EnvClient`` subclass; openenv's
``GenericEnvClient`` by default). The reply (the last match of ``action_pattern`` in it, when set)
fills the action's ``action_field``; the observation's ``observation_field`` (or all its fields)
is the next user message. The episode ends when the environment says done or after ``max_turns``
replies; its reward is the sum of the step rewards (``reward: last``: the last one). A row's
``seed`` and ``reset_kwargs`` go to ``reset``. openenv is imported when an episode runs (or the
dry run checks the arguments), never when rft is imported.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from rft.errors import WorkflowError, did_you_mean, refuse_unknown_keys
from rft.workflow.base import MultiTurnWorkflow
from rft.workflow.experience import Experience
from rft.workflow.registry import register_workflow
from rft.workflow.requires import python_package

NAME = "openenv_env"
REWARD_RULES = ("sum", "last")
_URL_SCHEMES = ("http://", "https://", "ws://", "wss://")
# the fields every openenv Observation/Action has; never the text shown or the field filled
_BASE_FIELDS = ("done", "reward", "metadata")
INVALID_ACTION = "Your reply held no valid action ({why}). Try again."
# OpenEnvArgs' field types, and their names in messages
_KINDS = {"str": (str, "string"), "dict": (dict, "mapping"), "int": (int, "whole number")}
_KINDS["float"] = (float, "number")


@dataclass(frozen=True)
class OpenEnvArgs:
    """The taskset's ``workflow_args`` for ``openenv_env``, each checked."""

    env: str = ""  # an openenv Environment subclass, run in-process ("pkg.module:Class")
    env_kwargs: dict = field(default_factory=dict)  # the env class's constructor arguments
    base_url: str = ""  # a running OpenEnv server (http://host:port), instead of env
    client: str = ""  # an EnvClient subclass for base_url; "" = openenv's GenericEnvClient
    action: str = ""  # the Action class; "" = read off the env's step() (or the client's type)
    action_field: str = ""  # the action field the reply fills; "" = the action's only field
    action_pattern: str = ""  # regex: the action is its last match in the reply (group 1 if any)
    observation_field: str = ""  # the field shown; "" = the only field, else "name: value" lines
    system_prompt: str = ""  # a system message before the first observation
    max_turns: int = 8  # model replies per episode
    reward: str = "sum"  # the episode's reward: "sum" or "last" of the step rewards
    reset_kwargs: dict = field(default_factory=dict)  # reset()'s arguments (a row's win)
    invalid_action_message: str = INVALID_ACTION  # told when a reply holds no valid action
    connect_timeout_s: float = 10.0  # base_url: the WebSocket connection's
    message_timeout_s: float = 60.0  # base_url: each reset/step answer's


def parse_args(args: Mapping[str, Any]) -> OpenEnvArgs:
    """The checked arguments; WorkflowError naming the key and what to write."""
    known = OpenEnvArgs.__dataclass_fields__
    refuse_unknown_keys(f"{NAME}: unknown workflow_args key", args, known)
    values = {}
    for key, value in args.items():
        kind, kind_name = _KINDS[known[key].type]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise WorkflowError(f"{NAME}: workflow_args.{key} must be a {kind_name}, got {value!r}")
        values[key] = value
    parsed = OpenEnvArgs(**values)
    if bool(parsed.env) == bool(parsed.base_url):
        raise WorkflowError(
            f"{NAME}: set exactly one of workflow_args.env (an openenv Environment class run "
            "in-process, 'pkg.module:Class') and workflow_args.base_url (a running OpenEnv "
            "server, http://host:port)"
        )
    if parsed.base_url and not parsed.base_url.startswith(_URL_SCHEMES):
        raise WorkflowError(
            f"{NAME}: workflow_args.base_url {parsed.base_url!r} must start with one of "
            f"{_URL_SCHEMES}"
        )
    if parsed.env and {"client", "connect_timeout_s", "message_timeout_s"} & set(args):
        raise WorkflowError(f"{NAME}: workflow_args.client and timeouts go with base_url, not env")
    if parsed.base_url and parsed.env_kwargs:
        raise WorkflowError(
            f"{NAME}: workflow_args.env_kwargs builds an in-process env; the server at "
            "base_url builds its own"
        )
    if parsed.max_turns < 1:
        raise WorkflowError(f"{NAME}: workflow_args.max_turns must be >= 1")
    if parsed.reward not in REWARD_RULES:
        raise WorkflowError(f"{NAME}: workflow_args.reward must be one of {REWARD_RULES}")
    if parsed.action_pattern:
        try:
            re.compile(parsed.action_pattern)
        except re.error as e:
            raise WorkflowError(f"{NAME}: workflow_args.action_pattern: {e}") from e
    return parsed


def import_object(spec: str, key: str) -> Any:
    """``pkg.module:Name`` or ``pkg.module.Name``; WorkflowError saying how to make it
    importable."""
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise WorkflowError(f"{NAME}: workflow_args.{key} {spec!r} is not 'pkg.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # a user's module may raise anything while it is imported
        raise WorkflowError(
            f"{NAME}: workflow_args.{key}: cannot import {module_name!r} "
            f"({type(e).__name__}: {e}); put its folder in a plugin directory (--plugin-dir) "
            "or on PYTHONPATH, and install what it imports"
        ) from e
    if not hasattr(module, attr):
        names = [n for n in vars(module) if not n.startswith("_")]
        raise WorkflowError(
            f"{NAME}: workflow_args.{key}: module {module_name!r} has no {attr!r}."
            f"{did_you_mean(attr, names)}"
        )
    return getattr(module, attr)


def _subclass(spec: str, key: str, base: type) -> type:
    found = import_object(spec, key)
    if not (isinstance(found, type) and issubclass(found, base)):
        raise WorkflowError(
            f"{NAME}: workflow_args.{key} {spec!r} is {found!r}, not a subclass of "
            f"{base.__module__}.{base.__qualname__}"
        )
    return found


def _typed_action(cls: type, action_base: type) -> Optional[type]:
    """The Action class an Environment/EnvClient subclass declares: its ``step(action: X)``
    annotation or its generic base's first argument (``Environment[X, ...]``)."""
    try:
        hinted = typing.get_type_hints(cls.step).get("action")
    except Exception:  # an unresolvable annotation: fall back to the generic base
        hinted = None
    candidates = [hinted]
    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            candidates += typing.get_args(base)[:1]
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, action_base):
            if candidate is not action_base:
                return candidate
    return None


def action_field_of(action_cls: Optional[type], wanted: str) -> str:
    """The field the reply fills: ``wanted``, checked against ``action_cls``, else the
    action's only field; WorkflowError when it cannot be told."""
    if action_cls is None:
        if not wanted:
            raise WorkflowError(
                f"{NAME}: the action's type is unknown (a GenericEnvClient sends plain dicts): "
                "set workflow_args.action_field (the field the reply fills) or "
                "workflow_args.action ('pkg.module:ActionClass')"
            )
        return wanted
    fields = [f for f in action_cls.model_fields if f not in _BASE_FIELDS]
    if wanted:
        if wanted not in fields:
            raise WorkflowError(
                f"{NAME}: workflow_args.action_field {wanted!r} is not a field of "
                f"{action_cls.__qualname__} (its fields: {fields}).{did_you_mean(wanted, fields)}"
            )
        return wanted
    if len(fields) != 1:
        raise WorkflowError(
            f"{NAME}: {action_cls.__qualname__} has fields {fields}: set "
            "workflow_args.action_field to the one the model's reply fills"
        )
    return fields[0]


@dataclass
class Plan:
    """What an episode needs, resolved from the arguments (at dry run too)."""

    args: OpenEnvArgs
    env_cls: Optional[type]  # in-process
    client_cls: Optional[type]  # base_url
    action_cls: Optional[type]  # None: a plain dict (GenericEnvClient)
    action_field: str


def resolve(args: OpenEnvArgs) -> Plan:
    """Import the classes the arguments name and check them (openenv is imported here)."""
    from openenv.core import EnvClient, GenericEnvClient
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action

    env_cls = client_cls = None
    if args.env:
        env_cls = _subclass(args.env, "env", Environment)
        declared = _typed_action(env_cls, Action)
    else:
        client_cls = _subclass(args.client, "client", EnvClient) if args.client else None
        client_cls = client_cls or GenericEnvClient
        declared = None if client_cls is GenericEnvClient else _typed_action(client_cls, Action)
    action_cls = _subclass(args.action, "action", Action) if args.action else declared
    if env_cls is not None and action_cls is None:
        raise WorkflowError(
            f"{NAME}: {env_cls.__qualname__}.step() declares no Action subclass: set "
            "workflow_args.action ('pkg.module:ActionClass')"
        )
    return Plan(
        args, env_cls, client_cls, action_cls, action_field_of(action_cls, args.action_field)
    )


def check_args(args: Mapping[str, Any]) -> None:
    """The dry run's check: the arguments parse and the classes they name import and fit.
    A server at ``base_url`` is not contacted (it may start with the job)."""
    resolve(parse_args(args))


# --- the episode -----------------------------------------------------------------------------


class InvalidAction(ValueError):
    """The reply makes no action the environment takes; the model is told why."""


@dataclass
class Seen:
    """One reset/step answer: the observation's fields (``done``/``reward``/``metadata``
    aside), its reward and whether the episode is over."""

    fields: dict
    reward: Optional[float]
    done: bool


def _seen(result: Any) -> Seen:
    """An Observation (in-process) or a client's StepResult, as :class:`Seen`."""
    if hasattr(result, "observation"):  # a StepResult: reward and done ride beside it
        obs = result.observation
        fields = obs if isinstance(obs, dict) else obs.model_dump(exclude=set(_BASE_FIELDS))
        return Seen(
            {k: v for k, v in fields.items() if k not in _BASE_FIELDS},
            result.reward,
            bool(result.done),
        )
    return Seen(result.model_dump(exclude=set(_BASE_FIELDS)), result.reward, bool(result.done))


def observation_text(seen: Seen, wanted: str) -> str:
    """The user message: field ``wanted``, else the only field, else one ``name: value`` line
    per field (non-strings as JSON)."""
    if wanted:
        if wanted not in seen.fields:
            raise WorkflowError(
                f"{NAME}: workflow_args.observation_field {wanted!r} is not in the observation "
                f"(its fields: {sorted(seen.fields)}).{did_you_mean(wanted, seen.fields)}"
            )
        return _text(seen.fields[wanted])
    if len(seen.fields) == 1:
        return _text(next(iter(seen.fields.values())))
    return "\n".join(f"{name}: {_text(value)}" for name, value in seen.fields.items())


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def action_text(reply: str, pattern: str) -> Optional[str]:
    """The action's text: the reply stripped, or the last match of ``pattern`` (its first
    group if it has one); None when the pattern does not match."""
    if not pattern:
        return reply.strip()
    matches = list(re.finditer(pattern, reply, re.DOTALL))
    if not matches:
        return None
    last = matches[-1]
    return (last.group(1) if last.re.groups else last.group(0)).strip()


class LocalSession:
    """An Environment instance in this process, for one episode."""

    def __init__(self, plan: Plan):
        try:
            self.env = plan.env_cls(**plan.args.env_kwargs)
        except TypeError as e:
            raise WorkflowError(
                f"{NAME}: {plan.env_cls.__qualname__}(**workflow_args.env_kwargs) failed: {e}; "
                "fix workflow_args.env_kwargs"
            ) from e
        self.plan = plan

    def reset(self, kwargs: dict) -> Seen:
        accepts = inspect.signature(self.env.reset).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in accepts.values())
        extra = [k for k in kwargs if k not in accepts and not takes_any]
        if extra:
            raise WorkflowError(
                f"{NAME}: {type(self.env).__qualname__}.reset() takes no {extra} (from "
                "workflow_args.reset_kwargs, the row's reset_kwargs or its seed column); "
                "drop them, or give reset() those parameters"
            )
        return _seen(self.env.reset(**kwargs))

    def step(self, action: Any) -> Seen:
        return _seen(self.env.step(action))

    def close(self) -> None:
        self.env.close()


class RemoteSession:
    """A WebSocket session on the OpenEnv server at ``base_url``, for one episode."""

    def __init__(self, plan: Plan):
        args = plan.args
        self.base_url = args.base_url
        client = plan.client_cls(
            base_url=args.base_url,
            connect_timeout_s=args.connect_timeout_s,
            message_timeout_s=args.message_timeout_s,
        )
        self.client = client.sync()
        try:
            self.client.connect()
        except ConnectionError as e:
            self.client.close()
            raise WorkflowError(
                f"{NAME}: cannot reach the OpenEnv server at {args.base_url} ({e}); start it "
                "(uvicorn pkg.module:app --host HOST --port PORT) where the explorer can reach "
                "it, or fix workflow_args.base_url"
            ) from e

    def _call(self, what: str, *call: Any, **kwargs: Any) -> Seen:
        try:
            return _seen(getattr(self.client, what)(*call, **kwargs))
        except RuntimeError as e:  # the client's "Server error: ... (code: ...)"
            hint = ""
            if "CAPACITY_REACHED" in str(e):
                hint = (
                    "; the server runs fewer sessions than the explorer's concurrent episodes: "
                    "raise its max_concurrent_envs (create_app(..., max_concurrent_envs=N), "
                    "with SUPPORTS_CONCURRENT_SESSIONS on the env) or lower "
                    "explorer.runner_per_model"
                )
            raise WorkflowError(f"{NAME}: {what} on {self.base_url} failed: {e}{hint}") from e

    def reset(self, kwargs: dict) -> Seen:
        return self._call("reset", **kwargs)

    def step(self, action: Any) -> Seen:
        try:
            return self._call("step", action)
        except WorkflowError as e:
            # the server refused the action's fields; its session goes on (as in-process)
            if "VALIDATION_ERROR" in str(e.__cause__):
                raise InvalidAction(f"the server refused it: {e.__cause__}") from e
            raise

    def close(self) -> None:
        self.client.close()


@register_workflow(NAME)
class OpenEnvWorkflow(MultiTurnWorkflow):
    """An OpenEnv environment, one conversation (and one sample) per episode; the model's
    replies are its engine's tokens, the observations are masked (as every multi-turn
    workflow's)."""

    can_repeat = False
    requires = (python_package("openenv-core", module="openenv"),)

    @classmethod
    def check_workflow_args(cls, workflow_args: Mapping[str, Any]) -> None:
        check_args(workflow_args)

    def run(self) -> list[Experience]:
        plan = resolve(parse_args(self.task.workflow_args))
        args = plan.args
        row = self.task.raw_task or {}
        reset_kwargs = {**args.reset_kwargs, **dict(row.get("reset_kwargs") or {})}
        if row.get("seed") is not None:
            reset_kwargs["seed"] = int(row["seed"])
        session = LocalSession(plan) if plan.env_cls is not None else RemoteSession(plan)
        try:
            return [self._play(session, plan, reset_kwargs)]
        finally:
            session.close()

    def _play(self, session: Any, plan: Plan, reset_kwargs: dict) -> Experience:
        from pydantic import ValidationError

        args = plan.args
        messages = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
        shown = observation_text(session.reset(reset_kwargs), args.observation_field)
        rewards: list[float] = []
        turns = invalid = 0
        done = False
        for _ in range(args.max_turns):
            messages.append({"role": "user", "content": shown})
            reply = self.model.chat(messages)[0]
            if reply.truncate_status == "prompt_truncated":
                break
            turns += 1
            messages.append({"role": "assistant", "content": reply.response_text})
            text = action_text(reply.response_text or "", args.action_pattern)
            try:
                if text is None:
                    raise InvalidAction(f"no match of {args.action_pattern!r}")
                action: Any = {plan.action_field: text}
                if plan.action_cls is not None:
                    action = plan.action_cls.model_validate(action)
                seen = session.step(action)
            except (InvalidAction, ValidationError) as e:
                invalid += 1
                why = e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e)
                shown = args.invalid_action_message.replace("{why}", why)
                continue
            rewards.append(float(seen.reward or 0.0))
            done = seen.done
            if done:
                break
            shown = observation_text(seen, args.observation_field)
        total = sum(rewards) if args.reward == "sum" else (rewards[-1] if rewards else 0.0)
        info = {
            "turns": turns,
            "env_steps": len(rewards),
            "invalid_actions": invalid,
            "done": float(done),
            "final_reward": rewards[-1] if rewards else 0.0,
            "return": total,
        }
        return self.process_messages_to_experience(messages, total, info=info)
