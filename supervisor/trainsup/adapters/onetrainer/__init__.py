"""The OneTrainer adapter: ``python scripts/train.py --config-path CONFIG.json [--config-value K=V ...]``.

``adapter`` (the contract: detect, open, launch, derived configs), ``plan`` (the command, the config
and how ``scripts/train.py`` resolves a key), ``backups`` (one backup directory: its name, complete
and sound without torch), ``states`` (the backups of a run, clearing ``backup/`` for a resume, the
final model), ``output`` (the true step from the tqdm bars, backups, ``Saving``, NaN), ``rules`` and
``remedies`` (faults and ladders in OneTrainer's config keys), ``inputs`` (the config, concept and
sample files edited mid-run), ``doctor`` (preflight findings).
"""
