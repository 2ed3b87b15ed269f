"""``rft-convert``: DeepSpeed ZeRO 1/2/3 and FSDP checkpoints -> Hugging Face safetensors.

``cli`` (find checkpoints, convert, publish), ``adapter`` (LoRA checkpoints: the PEFT adapter
folder and ``--merge``), ``readers`` (format detection), ``ds_reader`` and
``fsdp_reader`` (streaming readers), ``types``, ``torchfile`` (lazy ``torch.save`` reader with
CRC checks), ``output`` (crash recovery of the output folder, user files, the swap that
publishes it), ``identity`` (whether a ``huggingface/`` holds the checkpoint's model); the
streaming writer is shared with the trainer: :mod:`rft.safetensors_io`.
"""
