"""The run configuration: Trinity-RFT's YAML keys as typed dataclasses.

``names`` (every algorithm choice), ``schema`` (the dataclasses), ``typed_dict`` (dicts <->
dataclasses, errors with key paths), ``load`` (YAML, overrides, stages), ``rules`` (presets,
derived values, every cross-field check), ``auxiliary`` (reward models), ``batches`` and ``mix``
(a step's counts). Entry points: :func:`rft.config.load.load_config`, ``config_to_yaml``.
"""
