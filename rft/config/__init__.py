"""The run configuration: Trinity-RFT's YAML keys as typed dataclasses.

``names`` (every algorithm choice), ``schema`` (the dataclasses), ``typed_dict`` (dicts <->
dataclasses, errors with key paths), ``load`` (YAML, overrides, stages), ``rules`` (derived
values, cross-field checks; ``presets``, ``verl_rules``, ``trinity_rules`` and ``buffer_rules``
run inside it), ``queries`` (what the runtime reads from a checked config), ``auxiliary``
(reward models), ``batches`` and ``mix`` (a step's counts). Entry points:
:func:`rft.config.load.load_config`, ``config_to_yaml``.
"""
