"""The Hugging Face Trainer family: every front-end built on ``transformers.Trainer`` (TRL's ``trl sft``,
axolotl, LLaMA-Factory, Unsloth, a script of one's own), whose states are ``OUTPUT_DIR/checkpoint-N/``.

``adapter`` claims the commands and runs the session, ``plan`` reads and edits the settings (flags,
``key=value`` overrides, a YAML config, copied into the run dir when it changes), ``states`` knows when a
checkpoint is complete and which one a launch may resume from, ``output`` reads the progress bar,
``rules`` the Trainer's own wording of faults, ``remedies`` the ladders in its flags.
"""
