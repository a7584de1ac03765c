"""Owns a trainer command line as data: the launcher part, the flags, and edits to them.

Shared by the adapters whose trainers take ``--flag value`` arguments (sd-scripts, LitGPT's dotted
flags). kohya scripts take no positionals, so every token after the script up to the next ``--flag`` is a
value of the flag before it (``--network_args a=b c=d`` keeps both). Edits never reorder the launcher
part (``accelerate launch ...``) and keep unknown flags untouched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def _is_flag(token: str) -> bool:
    return token.startswith("--") and len(token) > 2


@dataclass
class Flag:
    name: str  # without the leading dashes
    values: list[str] = field(default_factory=list)

    def tokens(self) -> list[str]:
        return [f"--{self.name}", *self.values]


@dataclass
class TrainerCommand:
    """``launcher`` ends with the script token (``train_network.py`` or ``-m pkg.mod``)."""

    launcher: list[str]
    flags: list[Flag]

    @classmethod
    def parse(cls, argv: list[str], script_at: int | None = None) -> TrainerCommand:
        """Split at the script (``script_at``, else the ``*.py`` or ``-m`` module ``find_script`` finds)."""
        if not argv:
            raise ValueError("the command is empty: give the training command after `--`")
        if script_at is None:
            script_at = find_script(argv)
        launcher = list(argv[: script_at + 1])
        flags: list[Flag] = []
        for token in argv[script_at + 1 :]:
            if _is_flag(token):
                name, eq, value = token[2:].partition("=")
                flags.append(Flag(name, [value] if eq else []))
            elif flags:
                flags[-1].values.append(token)
            else:
                launcher.append(token)  # a stray positional: keep it where it was
        return cls(launcher, flags)

    # --- reading -------------------------------------------------------------------------------
    @property
    def script(self) -> str:
        """The trainer's script name without directory or ``.py`` (``flux_train_network``)."""
        try:
            token = self.launcher[find_script(self.launcher)]
        except ValueError:
            token = self.launcher[-1]
        base = os.path.basename(token)
        if base.endswith(".py"):
            return base[:-3]
        return token.rsplit(".", 1)[-1]

    def has(self, name: str) -> bool:
        return any(f.name == name for f in self.flags)

    def get(self, name: str) -> str | None:
        """The flag's last value (argparse keeps the last occurrence); None when absent or valueless."""
        for flag in reversed(self.flags):
            if flag.name == name:
                return flag.values[-1] if flag.values else None
        return None

    def get_int(self, name: str) -> int | None:
        value = self.get(name)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"--{name}: expected an integer, got {value!r}") from None

    # --- editing -------------------------------------------------------------------------------
    def set(self, name: str, *values: str) -> None:
        """Give the flag exactly these values (a store_true flag gets none), replacing every copy."""
        for flag in self.flags:
            if flag.name == name:
                flag.values = list(values)
                self.flags = [f for f in self.flags if f.name != name or f is flag]
                return
        self.flags.append(Flag(name, list(values)))

    def remove(self, name: str) -> bool:
        before = len(self.flags)
        self.flags = [f for f in self.flags if f.name != name]
        return len(self.flags) != before

    def argv(self) -> list[str]:
        out = list(self.launcher)
        for flag in self.flags:
            out.extend(flag.tokens())
        return out

    def copy(self) -> TrainerCommand:
        return TrainerCommand(list(self.launcher), [Flag(f.name, list(f.values)) for f in self.flags])


def find_script(argv: list[str]) -> int:
    """Index of the trainer script: the last ``*.py`` or ``-m module`` before the trainer's flags.

    Launchers come first (``accelerate launch --num_processes 1 train_network.py``, or a wrapper
    module that itself takes ``-m trainer``); once a script is found, a following ``--flag`` belongs
    to that script, so the search stops there.
    """
    found = -1
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "-m" and i + 1 < len(argv):
            found = i + 1
            i += 2
            continue
        if token.endswith(".py") and not _is_flag(token):
            found = i
        elif _is_flag(token) and found >= 0 and "launch" not in os.path.basename(argv[found]):
            break
        i += 1
    if found < 0:
        raise ValueError(
            f"cannot find the training script in {' '.join(argv)!r}: expected a `*.py` script "
            "or `-m module` (e.g. `accelerate launch train_network.py ...`)"
        )
    return found
