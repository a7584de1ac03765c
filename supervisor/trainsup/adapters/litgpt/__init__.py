"""The LitGPT adapter: ``litgpt finetune_lora|finetune|finetune_full|finetune_adapter|finetune_adapter_v2|pretrain``.

``adapter`` (the contract: detect, open, launch), ``methods`` (what each subcommand is in litgpt
0.5.13: weights file, resume ability, defaults), ``plan`` (the command and jsonargparse's order of
flags and ``--config`` files), ``configfile`` (a ``--config`` YAML and its derived copies),
``states`` (step folders, completeness without torch, out dirs, publishing ``final/``), ``output``
(progress, phases, when a save is over), ``rules`` and ``remedies`` (faults and ladders in LitGPT's
terms), ``doctor`` (preflight findings).
"""
