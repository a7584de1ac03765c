"""Owns the LitGPT preflight checks (``trainsup doctor``): reading the command and the files it
names, never running the trainer.

What the bed showed each mistake to do: a missing checkpoint dir exits 1 with ``is not a checkpoint
directory``; a dir without the model files exits 1 naming them; a relative checkpoint path that is
not a directory under the cwd is taken for a Hugging Face repo id (``Unsupported `repo_id```, exit 1);
``lr_warmup_steps >= max_steps`` trains every step but the last and then dies in the LR scheduler;
``lr_warmup_steps 0`` dies before the first step; an unknown ``--precision`` dies at start-up.
"""

from __future__ import annotations

from pathlib import Path

from ...trainers.base import Finding
from .methods import SUGGESTED_PRECISIONS, VALID_PRECISIONS
from .plan import LitPlan

# check_valid_checkpoint_dir: lit_model.pth, model_config.yaml, a tokenizer, tokenizer_config.json
_MODEL_FILES = ("lit_model.pth", "model_config.yaml", "tokenizer_config.json")
_TOKENIZERS = ("tokenizer.json", "tokenizer.model")


def resume_finding(plan: LitPlan) -> Finding:
    method = plan.method
    if method.resume == "path":
        return Finding("info", "resume", f"litgpt {plan.subcommand} resumes exactly from a saved state: after a "
                       f"fault trainsup passes --resume with the newest complete step-N/{method.weights} (never "
                       "`auto`, which takes the newest folder unchecked)")
    return Finding("warning", "no_resume", f"{method.why_no_resume}: after a fault trainsup restarts it from the "
                   "beginning, into an out dir of its own, so the steps before the fault are trained again",
                   "use finetune_full where a restart from step 0 costs too much: it resumes exactly")


def check(plan: LitPlan) -> list[Finding]:
    out = [resume_finding(plan)]
    out += _checkpoint(plan)
    out += _schedule(plan)
    out += _precision(plan)
    return out


def _checkpoint(plan: LitPlan) -> list[Finding]:
    if plan.method.positional != "checkpoint_dir":
        return []
    given = plan.positional()
    if given is None:
        return [Finding("blocker", "checkpoint_dir", f"litgpt {plan.subcommand} needs a checkpoint dir (the first "
                        "argument after the subcommand)", f"litgpt {plan.subcommand} /path/to/checkpoints/MODEL ...")]
    path = plan.resolve(given)
    if not Path(given).expanduser().is_absolute() and not path.is_dir():
        return [Finding("blocker", "checkpoint_relative", f"checkpoint dir {given!r} is relative and {path} is not a "
                        "directory: LitGPT takes it for a Hugging Face repo id and exits (Unsupported `repo_id`)",
                        "give the checkpoint dir as an absolute path")]
    if not path.is_dir():
        return [Finding("blocker", "checkpoint_missing", f"checkpoint dir {path} does not exist: LitGPT exits with "
                        "`is not a checkpoint directory`", "download or convert the model there (litgpt download)")]
    missing = [n for n in _MODEL_FILES if not (path / n).is_file()]
    if not any((path / n).is_file() for n in _TOKENIZERS):
        missing.append(" or ".join(_TOKENIZERS))
    if missing:
        return [Finding("blocker", "checkpoint_files", f"checkpoint dir {path} is missing {', '.join(missing)}",
                        "point at a complete LitGPT checkpoint dir (litgpt download / convert_to_litgpt)")]
    notes = []
    if not Path(given).expanduser().is_absolute():
        notes.append(Finding("warning", "checkpoint_relative", f"checkpoint dir {given!r} is relative: it works from "
                             f"{plan.cwd} only (elsewhere LitGPT takes it for a Hugging Face repo id)",
                             f"give it as {path}"))
    return notes + [Finding("info", "checkpoint_dir", f"checkpoint dir {path}: model files present")]


def _schedule(plan: LitPlan) -> list[Finding]:
    try:
        warmup = plan.get_int("train.lr_warmup_steps", plan.method.lr_warmup_steps)
        max_steps = plan.get_int("train.max_steps")
    except ValueError as exc:
        return [Finding("blocker", "train_args", str(exc))]
    if warmup is None:
        return []
    src = plan.where("train.lr_warmup_steps")
    where = "" if src == "--train.lr_warmup_steps" else \
        (" (LitGPT's default)" if src == "the default" else f" (set in {src})")
    if warmup == 0:
        return [Finding("blocker", "lr_warmup_zero", f"--train.lr_warmup_steps 0{where}: LitGPT's warmup divides "
                        "by it and the run dies before its first step (ZeroDivisionError)",
                        "--train.lr_warmup_steps 1 (or more, below --train.max_steps)")]
    if max_steps is not None and warmup >= max_steps:
        fix = max(1, max_steps - 1)
        return [Finding("blocker", "lr_warmup_too_long", f"--train.lr_warmup_steps {warmup}{where} is not below "
                        f"--train.max_steps {max_steps}: LitGPT trains every step but the last and then dies in "
                        "its LR scheduler (ZeroDivisionError), and a resume keeps the schedule",
                        f"--train.lr_warmup_steps {fix} (anything below {max_steps}; about 10% of the steps is usual)")]
    return []


def _precision(plan: LitPlan) -> list[Finding]:
    precision = plan.value("precision")
    if precision is None or precision in VALID_PRECISIONS:
        return []
    return [Finding("blocker", "precision", f"--precision {precision!r} is not one LitGPT (Lightning Fabric) takes; "
                    f"valid: {', '.join(SUGGESTED_PRECISIONS)}", "--precision 32-true (CPU) or bf16-true/bf16-mixed")]
