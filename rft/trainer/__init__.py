"""The trainer role: experiences in, policy updates with DeepSpeed ZeRO, weights out.

``loop`` (the training loop, a plain function), ``step`` (one policy update: old/ref log-probs,
advantages, losses), ``batching`` (rows -> rank shares -> micro-batches), ``engine`` (DeepSpeed:
the only module that imports ``deepspeed``), ``inputs``/``mix``/``sft`` (where a step's
experiences come from), ``state`` (the checkpoint folder protocol), ``checkpoint`` (writing
one under the lease, where a run resumes), ``lr_schedule``.
"""
