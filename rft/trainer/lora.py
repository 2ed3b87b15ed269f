"""LoRA on the policy (``model.lora_configs``): the PEFT wrap, and the adapter folder it publishes.

Data in: the base causal LM (loaded by :mod:`rft.trainer.engine`) and the run's
:class:`~rft.config.schema.LoRAConfig`. Data out: the model wrapped by PEFT (:func:`wrap`), and
from the adapter's gathered tensors, what a broadcast sends (:func:`saved_state`) or a PEFT
adapter folder (:func:`save_adapter_folder`). ``peft`` is imported here only (and by
``rft-convert`` for ``--merge``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

import torch

from rft.config.schema import LoRAConfig
from rft.models import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_saved_name
from rft.safetensors_io import TensorSpec, write_safetensors

ADAPTER = "default"  # PEFT's name of the one adapter, inside parameter names (".default.")
INIT_SEED = 0  # a new adapter's A is the same in every run and on every rank


def wrap(model: torch.nn.Module, lora: LoRAConfig, base_path: str) -> torch.nn.Module:
    """``model`` with a trainable LoRA adapter: a new one (PEFT's init: A random, seeded, B = 0,
    so step 0 is the base model) or the one in ``lora.path``; every base parameter frozen,
    only the adapter's ``lora_A``/``lora_B`` matrices train."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if lora.path:
        return PeftModel.from_pretrained(model, lora.path, is_trainable=True)
    config = LoraConfig(
        r=lora.lora_rank,
        lora_alpha=lora.lora_alpha,
        lora_dropout=lora.lora_dropout,
        target_modules=lora.target_modules,
        exclude_modules=lora.exclude_modules,  # Trinity's LoRAConfig.exclude_modules
        task_type="CAUSAL_LM",
        bias="none",
    )
    with torch.random.fork_rng(devices=[]):  # the run's own random state is left as it was
        torch.manual_seed(INIT_SEED)
        wrapped = get_peft_model(model, config)
    wrapped.peft_config[ADAPTER].base_model_name_or_path = base_path
    return wrapped


@contextlib.contextmanager
def adapter_disabled(module: Any) -> Iterator[None]:
    """The base model inside the block: the reference policy of a LoRA run's KL term, the same
    module with the adapter disabled (no second copy of the model)."""
    with module.disable_adapter():
        yield


def saved_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter's tensors under PEFT's saved names (what a broadcast sends, what
    ``adapter_model.safetensors`` holds)."""
    return {adapter_saved_name(name, ADAPTER): tensor for name, tensor in state.items()}


def save_adapter_folder(module: Any, state: dict[str, torch.Tensor], folder: Path) -> None:
    """``folder`` as a PEFT adapter folder: the config of ``module``'s adapter and ``state``
    (live names -> gathered tensors), each tensor written under PEFT's saved name (without the
    adapter's name), as vLLM, PEFT and ``rft-convert --merge`` load it."""
    folder.mkdir(parents=True, exist_ok=True)
    module.peft_config[ADAPTER].save_pretrained(folder)  # adapter_config.json, as PEFT writes it
    assert (folder / ADAPTER_CONFIG).is_file()
    tensors = saved_state(state)
    specs = [TensorSpec(name, tuple(t.shape), t.dtype) for name, t in tensors.items()]
    write_safetensors(folder / ADAPTER_WEIGHTS, specs, lambda spec: tensors[spec.name].cpu())
