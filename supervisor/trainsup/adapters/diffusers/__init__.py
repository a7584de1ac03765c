"""The accelerate ``checkpoint-N`` scripts: diffusers' example trainers (``train_text_to_image_lora.py``,
``train_dreambooth_lora.py``, ...) and the scripts modelled on them, whose states are
``OUTPUT_DIR/checkpoint-N/`` written by ``accelerator.save_state`` every ``--checkpointing_steps`` and
resumed by ``--resume_from_checkpoint``.
"""
