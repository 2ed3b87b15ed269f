"""Environments rft ships, each also an example of writing a workflow. Offline on CPU with the
base install: ``calculator`` (arithmetic the model solves by calling a calculator tool),
``guess_number`` (a multi-turn game with higher/lower feedback), ``frozen_lake``, ``toolcall``
(tasksets from ``data/agent/generate.py`` and friends). Environments of other formats, each
needing its package (``bash env/setup.sh --envs``; ``Workflow.requires`` says which, and the
dry run names it when missing): ``openenv_env`` (an OpenEnv environment, in-process or over
its server), ``sciworld_workflow`` (Trinity's ScienceWorld agent; a Java runtime too),
``alfworld_workflow`` and ``step_wise_alfworld_workflow`` (Trinity's ALFWorld agents) and
Trinity's AgentScope ReAct workflows. Trinity's R3L RAFT baselines (``r3l*``): countdown and
DAPO math on the base install, ScienceWorld as ``sciworld_workflow``."""
