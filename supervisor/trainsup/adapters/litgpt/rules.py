"""Owns the fault rules of LitGPT's own wording, tried before the built-in table.

Two fault ids are LitGPT's alone and stay here, not in ``faults.rules.FAULT_IDS`` (that tuple is the
built-in table's, and nothing outside this adapter needs them): ``lr_schedule`` (the learning-rate
schedule divides by zero) and ``sequence_too_long`` (a sample longer than the model's context).
The others reuse built-in ids with LitGPT's wording: ``config_error`` (an invalid ``--precision``,
a checkpoint dir that is not one, jsonargparse's usage errors, a global batch below the micro batch)
and ``nan_loss``. ``RUN_RULES`` serve a run of this adapter; ``FAMILY_RULES`` (without the bare
``AssertionError`` rule) are what ``diagnose`` tries on a log of any trainer.
"""

from __future__ import annotations

from ...faults.rules import FaultRule

LR_SCHEDULE = "lr_schedule"
# torch's lr_scheduler.py frames, the warmup lambda of litgpt's get_lr_scheduler (`lora.py <lambda>`), or
# a schedule lambda of transformers (`optimization.py _get_polynomial_decay_schedule_with_warmup_lr_lambda`)
_LR_FRAMES = (r"^lr_scheduler\.py ", r"^(?:lora|full|adapter|adapter_v2|pretrain|lora_legacy)\.py <lambda>$",
              r"^optimization\.py _get_\w+_lr_lambda$")
SEQUENCE_TOO_LONG = "sequence_too_long"
# LitGPT's model refusing a long sample: ``Cannot attend to 4096, block size is only 2048``. Its named
# groups travel on the evidence to the remedy (``remedies._max_seq_length``): ``tokens`` in the sample,
# the model's ``block`` size.
CANNOT_ATTEND = r"Cannot attend to (?P<tokens>\d+), block size is only (?P<block>\d+)"

LITGPT_RULES: tuple[FaultRule, ...] = (
    FaultRule(
        id=LR_SCHEDULE,
        # `ZeroDivisionError: float division by zero` (cosine T_max = max_steps - warmup = 0, at the
        # last step) or `division by zero` (warmup 0: `step / warmup_steps`, before any step).
        patterns=(r"ZeroDivisionError",),
        # Only a division inside the LR scheduler: torch's lr_scheduler.py frames, or the warmup
        # lambda of litgpt's get_lr_scheduler (`lora.py <lambda>`). A ZeroDivisionError raised
        # anywhere else is not this fault.
        frames_require=_LR_FRAMES,
        # An optimizer's own step (schedule-free AdamW divides by its weight sum) runs inside torch's
        # lr_scheduler wrapper of optimizer.step: innermost first, it refutes before the wrapper confirms.
        frames_exclude=(r"^(?!lr_scheduler\.py )\S+ step$",),
        # A traceback cut before its exception line, in the schedule, with the division or a zero warmup
        # (LitGPT prints its TrainArgs at start) in sight.
        cut_frames=_LR_FRAMES,
        cut_hints=(r"ZeroDivisionError", r"\blr_warmup_steps=0\b", r"/ warmup_steps$", r"/ decay_steps$"),
        explanation="LitGPT's learning-rate schedule divided by zero: --train.lr_warmup_steps is 0, or not "
        "below the run's optimizer steps (--train.max_steps, or epochs x steps per epoch). LitGPT keeps "
        "the schedule in its saved states, so only a fresh start can take a corrected warmup.",
    ),
    FaultRule(
        id=SEQUENCE_TOO_LONG,
        patterns=(CANNOT_ATTEND,),
        # cut before the exception line: the raise in the model's max_seq_length setter shows the wording
        cut_frames=(r"^model\.py max_seq_length$",),
        cut_hints=(r"Cannot attend to",),
        explanation="A training sample is longer than the model's context (block size); "
        "--train.max_seq_length truncates the samples to it.",
    ),
    FaultRule(
        id="config_error",
        patterns=(
            r"Precision '[^']{0,100}' is invalid\. Allowed precision values:",
            r"Precision \S{0,100} is invalid\. Allowed precision values:",
            r"is not a checkpoint directory", r"Unsupported `repo_id`", r"is missing the files: \[",
            # jsonargparse's usage errors (argparse's own wording is lowercase, in the built-ins)
            r"error: Unrecognized arguments:", r"error: Parser key \"", r"error: Validation failed:",
            r"error: Configuration check failed", r"Quantization and mixed precision is not supported",
        ),
        # A traceback cut in the checkpoint-dir check (it prints its message and raises SystemExit).
        cut_frames=(r" check_valid_checkpoint_dir$",),
        restartable=False,
        explanation="The LitGPT command is wrong: an invalid --precision, a checkpoint dir that is not one "
        "(LitGPT takes a relative name for a Hugging Face repo id), or an argument jsonargparse rejects.",
    ),
    FaultRule(
        id="nan_loss",
        patterns=(r"loss train: nan\b",),
        live=True,
        explanation="The training loss became NaN; LitGPT keeps going but learns nothing.",
    ),
)

# Only for a run this adapter knows is LitGPT: a bare `AssertionError` is this fault when its frames
# say so, but with no frames in sight the message alone would decide, which is too little for a log
# of an unknown trainer (``diagnose`` tries ``FAMILY_RULES`` on every log).
BATCH_RULE = FaultRule(
    id="config_error",
    # `assert gradient_accumulation_iters > 0` / `assert batch_size > 0` in litgpt/args.py: the
    # global batch is smaller than the micro batch (or than the devices).
    patterns=(r"^AssertionError$",),
    frames_require=(r"^args\.py (?:gradient_accumulation_iters|batch_size)$",),
    restartable=False,
    explanation="--train.global_batch_size is smaller than --train.micro_batch_size x devices.",
)
FAMILY_RULES = LITGPT_RULES
RUN_RULES = (*LITGPT_RULES, BATCH_RULE)
