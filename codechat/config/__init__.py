"""Configuration and the small leaves every stage stands on; nothing here imports the rest of codechat.

- :mod:`.stages`: the frozen, validated sections (``data``, ``optim``, ``train``, ``run``) and the
  pretraining stage; :mod:`.model`: the ``model`` section and its presets; :mod:`.sft`: chat SFT's
  section and stage;
- :mod:`.yaml_io`: building a config from mappings, YAML files and dotted CLI overrides;
- :mod:`.device`: the device, bf16 autocast, peak FLOP/s; :mod:`.atomic`: atomic file writes;
  :mod:`.hosts`: whether a host is this machine; :mod:`.log`: messages to the user, one line each on stderr.
"""
