"""Owns the facts in which trainers built like sd-scripts differ, for the modules they share.

musubi-tuner (``adapters.musubi``) is kohya's own trainer for video and image DiTs: the same
``steps`` bar, accelerate states, save names, sample names and dataset TOML, but its own scripts and
flags, no ``train_state.json`` in a state, no ``--initial_step``, and a resumed run that counts its
steps *and* epochs from 0 and trains exactly ``--max_train_steps``. The shared modules (``plan``,
``states``, ``points``, ``publish``, ``prepare``, ``prompts``, ``inputs``) take a ``Dialect`` and
ask it, never a family name; ``KOHYA`` is sd-scripts' and every default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .profile import STORE_TRUE, ScriptInfo, script_info


@dataclass(frozen=True)
class PromptOptions:
    """The ``--x value`` options a sample-prompt ``.txt`` line may carry, by the value they take."""

    ints: frozenset[str]
    floats: frozenset[str]
    texts: frozenset[str]
    negative_ints: bool = True  # sd-scripts reads ``-?\\d+``; musubi ``\\d+`` only


@dataclass(frozen=True)
class Dialect:
    trainer: str  # the family's name (identity, words)
    words: str  # how a sentence names the trainer ("sd-scripts")
    info: Callable[[str], ScriptInfo]  # a script's kind, and the flags it has
    store_true: frozenset[str]  # flags that take no value
    # The trainer's own files of a state, written before accelerate's (sd-scripts: train_state.json,
    # which holds its step label); none: a state's label is read from its name.
    state_first: tuple[str, ...]
    prompt_options: PromptOptions
    # After a resume it trains on to the end of the last epoch (sd-scripts: its global step runs
    # behind, so its stop at --max_train_steps never fires); False: it stops at --max_train_steps.
    overshoots: bool = True
    epochs_restart: bool = False  # after a resume its epoch count restarts at 1 (musubi)
    # Only a state at an epoch's end resumes with an uninterrupted run's data order: prefer one, and
    # have trainsup save one at every epoch's end (``--save_every_n_epochs 1``).
    exact_at_epoch_end: bool = True

    def takes_value(self, flag: str) -> bool:
        return flag not in self.store_true


KOHYA = Dialect(
    trainer="kohya", words="sd-scripts", info=script_info, store_true=STORE_TRUE,
    state_first=("train_state.json",),
    prompt_options=PromptOptions(frozenset({"w", "h", "d", "s", "f"}), frozenset({"l", "g", "am"}),
                                 frozenset({"n", "ss", "cn", "ctrl"})),
)
