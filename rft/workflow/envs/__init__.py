"""Environments rft ships, runnable offline on CPU, each also an example of writing a workflow:
``calculator`` (arithmetic the model solves by calling a calculator tool) and ``guess_number``
(a multi-turn game with higher/lower feedback). Their tasksets come from
``data/agent/generate.py``."""
