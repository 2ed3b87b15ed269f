"""Trinity's ``model.external_model``: which modes take it, and where its endpoint is.

Data in: a typed :class:`~rft.config.Config` and the environment. Data out: the endpoint's
URL, key and model name (:func:`external_endpoint`), or a :class:`ConfigError` that says what to
set. Opens no connection (:mod:`rft.explorer.external` talks to the endpoint) and imports no
client library, so the login node's dry run can call it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from rft.config.schema import Config
from rft.errors import ConfigError

EXTERNAL_MODES = ("bench",)  # an endpoint's replies carry no token ids or log-probs to train on


@dataclass(frozen=True)
class ExternalEndpoint:
    base_url: str  # the OpenAI base URL, ending in /v1
    api_key: str
    model_name: str  # the ``model`` of each request
    base_url_env: str  # the variables they came from, for messages
    api_key_env: str


def uses_external_model(cfg: Config) -> bool:
    return cfg.model.external_model.enable


def check_external_mode(cfg: Config) -> None:
    """ConfigError when ``model.external_model.enable`` meets a mode that trains or explores."""
    if uses_external_model(cfg) and cfg.mode not in EXTERNAL_MODES:
        raise ConfigError(
            f"model.external_model.enable: true with mode {cfg.mode}: external_model only "
            "evaluates: use mode bench (an OpenAI-compatible endpoint returns text, not the "
            "token ids and log-probs that training needs)"
        )


def external_endpoint(cfg: Config, environ: Mapping[str, str] = os.environ) -> ExternalEndpoint:
    """The endpoint of ``model.external_model``, its URL and key read from the environment
    variables it names. A URL without ``/v1`` gets it appended (Trinity accepts both)."""
    check_external_mode(cfg)
    ext = cfg.model.external_model
    missing = [name for name in (ext.base_url_env, ext.api_key_env) if not environ.get(name)]
    if missing:
        raise ConfigError(
            f"model.external_model: environment variable(s) {', '.join(missing)} not set: "
            f"export {ext.base_url_env}=<the endpoint's URL, e.g. http://host:8000/v1> and "
            f"{ext.api_key_env}=<its API key> (EMPTY for a server that checks none) before the "
            "bench starts (model.external_model.base_url_env/api_key_env name other variables)"
        )
    base_url = environ[ext.base_url_env].strip().rstrip("/")
    if not base_url.startswith(("http://", "https://")):
        raise ConfigError(
            f"{ext.base_url_env}={base_url!r} is not an http(s) URL: set it to the endpoint's "
            "OpenAI base URL, e.g. http://host:8000/v1"
        )
    if not base_url.endswith("/v1"):
        base_url += "/v1"
    assert ext.model_name, "ExternalModelConfig requires model_name with enable"
    return ExternalEndpoint(
        base_url, environ[ext.api_key_env], ext.model_name, ext.base_url_env, ext.api_key_env
    )
