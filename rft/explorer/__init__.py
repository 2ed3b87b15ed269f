"""The explorer role: tasks in, scored rollouts out to the buffer.

``loop`` (the explorer loop, a plain function), ``tasksets`` (task order, cursors, prompts),
``episodes`` (workflow classes run concurrently, their model calls batched), ``reward_model``
and ``auxiliary`` (``explorer.auxiliary_models``: score heads; generative models such as a
judge, each its own engine), ``engine`` (vLLM: the only module that imports ``vllm``),
``bench`` (``mode: bench``), ``debug`` (``rft-debug``). Workflows and rewards: :mod:`rft.workflow`.
"""
