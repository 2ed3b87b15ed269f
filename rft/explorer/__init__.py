"""The explorer role: tasks in, scored rollouts out to the buffer.

``loop`` (the explorer loop, a plain function), ``tasksets`` (task order, cursors, prompts),
``workflows`` (rows -> chat messages, scoring), ``rewards`` (pure reward functions and their
combination with reward model scores), ``reward_model`` (``explorer.auxiliary_models``: score
heads run with transformers next to the engine), ``engine`` (vLLM: the only module that imports
``vllm``), ``bench`` (``mode: bench``).
"""
