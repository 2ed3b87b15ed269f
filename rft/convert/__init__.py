"""``rft-convert``: DeepSpeed ZeRO 1/2/3 and FSDP checkpoints -> Hugging Face safetensors.

``cli`` (find checkpoints, convert, publish), ``readers`` (format detection), ``ds_reader`` and
``fsdp_reader`` (streaming readers), ``types``, ``torchfile`` (lazy ``torch.save`` reader),
``safetensors_io`` (streaming writer).
"""
