"""The explorer role: tasks in, scored rollouts out to the buffer.

``loop`` (the explorer loop, a plain function), ``tasksets`` (task order, cursors, prompts),
``workflows`` (rows -> chat messages, scoring), ``rewards`` (pure reward functions), ``engine``
(vLLM: the only module that imports ``vllm``), ``bench`` (``mode: bench``).
"""
