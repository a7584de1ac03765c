"""Owns turning the user's command into the first launch plan, before anything runs.

It reads the flags kohya will see (command line over ``--config_file``), fixes a seed when none is
given (every attempt must draw the same data order and noise), and adds ``--save_state`` with a step
cadence when the command saves no states (without them there is nothing safe to resume from). A
trainer of the sd-scripts dialect also saves a state at every epoch's end (its exact resume points).
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from ...trainers.base import Settings, UsageError
from ...trainers.cmdline import TrainerCommand
from . import tomlio
from .dialect import KOHYA, Dialect
from .doctor import WORKERS_0_NOTE
from .plan import LaunchPlan
from .profile import state_holds_step

KOHYA_DEFAULT_MAX_STEPS = 1600


@dataclass
class Prepared:
    plan: LaunchPlan
    output_dir: Path | None
    output_name: str | None
    max_train_steps: int
    user_resume: Path | None
    notes: list[str] = field(default_factory=list)  # what trainsup changed, said on the console
    save_every_steps: int | None = None  # the step cadence the output dir shows
    user_epoch_every: int | None = None  # the user's own epoch cadence (trainsup saves every epoch)


def _resolve(path: str, cwd: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else cwd / p


def prepare(argv: list[str], cwd: Path, policy: Settings, rng: random.Random | None = None,
            as_given: bool = False, dialect: Dialect = KOHYA) -> Prepared:
    """The first launch plan; ``as_given``: the command unchanged, its files read where they exist."""
    try:
        command = TrainerCommand.parse(list(argv))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if as_given:
        return _as_given(command, cwd, dialect)
    config_path = command.get("config_file")
    if config_path and not config_path.endswith(".toml"):
        config_path += ".toml"  # kohya appends it the same way
    user_config = _resolve(config_path, cwd) if config_path else None
    config: dict[str, object] = {}
    config_doc = None
    if user_config is not None:
        try:
            config_doc = tomlio.read_toml(user_config)
            config = tomlio.flat_keys(config_doc)
        except tomlio.ConfigFileError as exc:
            raise UsageError(f"--config_file {exc}") from None
        command.set("config_file", str(user_config))
    plan = LaunchPlan(command, {}, set(), user_config, config_doc, dialect=dialect)

    def value(name: str) -> object | None:
        v = command.get(name)
        return v if v is not None else config.get(name)

    def int_value(name: str) -> int | None:
        v = value(name)
        if v is None:
            return None
        try:
            return int(str(v))
        except ValueError:
            raise UsageError(f"--{name}: expected an integer, got {v!r}") from None

    out = value("output_dir")
    output_dir = _resolve(str(out), cwd) if out else None
    name = value("output_name")
    output_name = str(name) if name else None
    max_steps = int_value("max_train_steps") or KOHYA_DEFAULT_MAX_STEPS
    notes: list[str] = []

    resume = value("resume")
    user_resume = _resolve(str(resume), cwd) if resume else None

    if int_value("seed") is None:
        # Drawn from the command itself, so that every start of the same run (a new supervisor after a
        # stop or a crash) fixes the same seed: its states resume with the data order they began with.
        seed = (rng or random.Random(zlib.crc32("\0".join(argv).encode("utf-8")))).randrange(1, 2**31 - 1)
        command.set("seed", str(seed))
        notes.append(f"no --seed given: fixed --seed {seed} so every attempt sees the same data order")
    script = Path(command.launcher[-1]).name
    if dialect is KOHYA and not state_holds_step(script):
        # Its states cannot resume a run where it was: no save of trainsup's own is worth adding.
        notes.append(f"note: {script} saves no train_state.json, so its --resume counts steps from 0 again: "
                     "after a fault trainsup starts this run over from the beginning")
        return Prepared(plan, output_dir, output_name, max_steps, user_resume, notes,
                        int_value("save_every_n_steps"), int_value("save_every_n_epochs"))
    if not plan.effective("save_state"):
        command.set("save_state")
        notes.append("no --save_state: added it, so there is a state to resume from")
    user_epochs = int_value("save_every_n_epochs")
    if int_value("save_every_n_steps") is None and user_epochs is None:
        every = policy.save_every_n_steps or max(1, round(max_steps / 10))
        command.set("save_every_n_steps", str(every))
        notes.append(f"no save cadence: added --save_every_n_steps {every} (about 10% of {max_steps} steps)")
    if dialect.exact_at_epoch_end and user_epochs != 1 and value("save_n_epoch_ratio") is None:
        # Only a state saved at an epoch's end resumes with the data order an uninterrupted run has
        # there; these saves go to trainsup's run dir, out of the output dir's sight.
        command.set("save_every_n_epochs", "1")
        notes.append("added --save_every_n_epochs 1: sd-scripts resumes exactly only from an epoch's end "
                     "(trainsup keeps those saves in its run dir, out of the output dir)")
    if dialect.exact_at_epoch_end and int_value("max_data_loader_n_workers") == 0:
        notes.append(f"note: {WORKERS_0_NOTE}")
    return Prepared(plan, output_dir, output_name, max_steps, user_resume, notes,
                    int_value("save_every_n_steps"), user_epochs)


def _as_given(command: TrainerCommand, cwd: Path, dialect: Dialect) -> Prepared:
    """The command exactly as given (``diagnose``, ``doctor``): its --config_file is read when it
    exists here; otherwise only the command line is known. The output dir is resolved from ``cwd``."""
    config = command.get("config_file")
    plan = LaunchPlan(command, {}, set(), dialect=dialect)
    if config:
        if not config.endswith(".toml"):
            config += ".toml"  # kohya appends it the same way
        path = Path(config).expanduser()
        try:
            plan = LaunchPlan(command, {}, set(), path, tomlio.read_toml(_resolve(config, cwd)), dialect=dialect)
        except (tomlio.ConfigFileError, OSError):
            pass  # not on this machine (or broken)
    out, name = plan.value("output_dir"), command.get("output_name")
    return Prepared(plan, _resolve(str(out), cwd) if out else None, name, KOHYA_DEFAULT_MAX_STEPS, None)
