"""The run configuration: Trinity-RFT's YAML keys as typed dataclasses.

``names`` (every algorithm choice, declared once), ``schema`` (the dataclasses, one commented
field each), ``typed_dict`` (dicts <-> dataclasses
with full key paths in errors), ``load`` (YAML, ``${oc.env:...}``, ``key=value`` overrides,
stages), ``rules`` (presets, derived values, every cross-field check), ``auxiliary`` (the
reward models of ``explorer.auxiliary_models``: their checks, GPUs and reward weights).
Entry points: :func:`rft.config.load.load_config`, :func:`rft.config.load.config_to_yaml`.
"""
