"""Owns remedies: declarative edits of a launch, the trainer-neutral default ladder of them for each
fault class, and the ladder machinery every adapter's own ladders use.

A ``Remedy`` is a tuple of ``Action``s; ``describe()`` prints it, the journal records it, and it is
applied to a ``LaunchPlan`` (see ``run.plan``). When the same fault comes back after a rung, the next
rung applies. A rung none of whose actions applies to this command (the flag is absent, or the script
has no such flag) is skipped.

``DEFAULT`` knows no trainer: it restarts from the last safe state where a restart can help, stops
with the diagnosis where it cannot, and otherwise holds only what means the same for every trainer
(an environment variable, a package upgrade, a wait for other programs' GPU memory) or an abstract
action each adapter carries out in its own terms (``halve_batch``, ``lower_workers``: a trainer
without such a setting skips the rung). Each adapter's ``remedies`` module holds its own ladders, in
its own flags, and falls back on ``DEFAULT``; an action an adapter builds carries the adapter's
wording (``says``), so no trainer's flags are printed for another's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from .linetext import clean_line
from .oom import fragmentation_ruled_out
from .rules import REQUIRED_VERSION
from .verdict import Said

ActionKind = Literal["add_flag", "remove_flag", "set_env", "upgrade", "halve_batch", "lower_resolution",
                     "lower_workers", "raise_timeout", "wait_foreign", "restart", "stop"]


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    name: str = ""  # flag, env var or package spec
    value: str | None = None  # flag value, env value; for "stop" the reason
    # How the adapter that built the action says it to a person (its own flags); None: the neutral words.
    says: str | None = field(default=None, compare=False)

    def describe(self) -> str:
        if self.says is not None:
            return self.says
        if self.kind == "add_flag":
            return f"add --{self.name}" + (f" {self.value}" if self.value is not None else "")
        if self.kind == "remove_flag":
            return f"remove --{self.name}"
        if self.kind == "set_env":
            return f"set {self.name}={self.value}"
        if self.kind == "upgrade":
            return f"upgrade {self.name} in the trainer's interpreter"
        if self.kind == "halve_batch":
            return "halve the batch size and double the gradient accumulation steps"
        if self.kind == "lower_workers":
            return f"lower the DataLoader workers (to {self.value})"
        if self.kind == "raise_timeout":
            return f"raise the trainer's collective timeout (times {self.value})"
        if self.kind == "lower_resolution":
            return f"lower the training resolution (times {self.value})"
        if self.kind == "wait_foreign":
            return "wait for other programs to free the GPUs' memory, then restart with the same flags"
        if self.kind == "restart":
            return "restart from the last safe state"
        return f"stop: {self.value}"


@dataclass(frozen=True)
class Rung:
    actions: tuple[Action, ...]
    repeat: bool = False  # stays the current rung when the fault recurs (plain restarts)
    when: str | None = None  # a regex the evidence line must match: the rung answers that wording only

    def fits(self, evidence: Said) -> bool:
        """Whether this rung answers the evidence (a rung without ``when`` answers any, and the
        evidence rules none of its actions out).

        ``when`` is searched in the evidence's line, never its groups: it names the wording the rung
        answers, whichever rule recognised it (a user rule's, without groups, included)."""
        if self.unfit_reason(evidence) is not None:
            return False
        return self.when is None or (evidence.line is not None and re.search(self.when, evidence.line) is not None)

    def unfit_reason(self, evidence: Said) -> str | None:
        """Why the evidence itself rules this rung out, or None.  Every adapter's allocator rung
        (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) is skipped when the OOM message's
        numbers show no fragmentation it could undo (see ``oom``)."""
        if any(a.kind == "set_env" and a.name == "PYTORCH_CUDA_ALLOC_CONF" and "expandable_segments" in (a.value or "")
               for a in self.actions):
            return fragmentation_ruled_out(evidence)
        return None

    def describe(self) -> str:
        return "; ".join(a.describe() for a in self.actions)


def _flags(kind: ActionKind, *names: str) -> tuple[Action, ...]:
    return tuple(Action(kind, n) for n in names)


def stop(reason: str) -> Rung:
    return Rung((Action("stop", value=reason),))


RESTART = Rung((Action("restart"),), repeat=True)
TIMEOUT_FACTOR = 4
RAISE_TIMEOUT = Action("raise_timeout", value=str(TIMEOUT_FACTOR))
# An OOM while other programs held memory on the trainer's GPUs: wait for them once before the
# ladder changes any flag (repeat: the ladder stays where it was).
WAIT_FOREIGN = Rung((Action("wait_foreign"),), repeat=True)

DEFAULT: dict[str, tuple[Rung, ...]] = {
    "meta_tensor": (stop("weights stayed on the meta device: the model file's key layout does not match this "
                         "script; check the model path it loads"),),
    "device_mismatch": (stop("tensors are on two devices (the code moves one to a device and not the other); "
                             "a restart cannot fix it"),),
    "te_cache_none": (
        Rung((Action("restart"),)),
        stop("sample prompts still find no text-encoder output after a restart"),
    ),
    "fp8_serializer": (
        Rung((Action("upgrade", "safetensors>=0.4.2"),)),
        stop("the serializer still fails after the upgrade"),
    ),
    "cuda_oom": (
        Rung((Action("set_env", "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),)),
        Rung((Action("halve_batch"),)),
        stop("out of GPU memory after every memory remedy"),
    ),
    "shm_exhausted": (
        Rung((Action("lower_workers", value="half"),)),
        Rung((Action("lower_workers", value="0"),)),
        stop("shared memory is exhausted even without DataLoader workers; enlarge /dev/shm"),
    ),
    # A collective that timed out while every rank lived (a rank that died ends the attempt as its own fault):
    # one rank was elsewhere longer than the group's timeout, most often in work only it does (caching,
    # sampling, validation, a save); an identical restart meets the same wall, a longer timeout does not.
    # Raised again at each recurrence (the phase outlasted four times the last timeout); a trainer without the
    # setting gets plain restarts, and a recurrence at the same step stops the run (``FaultClass``).
    "nccl_timeout": (Rung((RAISE_TIMEOUT,), repeat=True), RESTART),
    "nccl_error": (RESTART,),
    "cuda_fatal": (RESTART,),
    "corrupt_checkpoint": (RESTART,),
    "nan_loss": (
        Rung((Action("restart"),)),
        stop("the loss became NaN again after resuming from the last state saved before it; "
             "lower the learning rate"),
    ),
    "nan_latents": (stop("the VAE encodes NaN latents at this precision; run it in float32"),),
    "host_oom_killed": (
        Rung((Action("lower_workers", value="half"),)),
        RESTART,
    ),
    "flag_conflict": (stop("the trainer rejects this combination of options"),),
    "fp8_op_unsupported": (stop("an op without a float8 kernel is hit; turn float8 weights off"),),
    "config_error": (stop("the command or its files are wrong; a restart cannot fix it"),),
    "missing_dependency": (stop("the trainer's environment lacks a package; a restart cannot fix it"),),
    "disk_full": (stop("the disk is full; free space yourself (trainsup never deletes checkpoints)"),),
    "hang": (
        Rung((Action("restart"),)),
        # A DataLoader worker that stopped delivering batches: load in the main process instead.
        Rung((Action("lower_workers", value="0"),), when=r"DataLoader waits"),
        stop("it hung again after a restart; the stacks are in the run dir's hang-N.txt"),
    ),
    "unknown": (RESTART,),
}


def ladder(fault: str, own: dict[str, tuple[Rung, ...]] | None = None) -> tuple[Rung, ...]:
    """The ladder of ``fault``: an adapter's ``own`` one, else the neutral default, else a restart."""
    if own is not None and fault in own:
        return own[fault]
    return DEFAULT.get(fault, DEFAULT["unknown"])


# transformers' import-time dependency check (see ``rules.REQUIRED_VERSION``), for evidence without its groups.
_REQUIRED = re.compile(REQUIRED_VERSION)
_AT_LEAST = re.compile(r">=\s*(\d+(?:\.\d+)*)$")


def required_spec(evidence: Said) -> str | None:
    """The requirement an import-time version check printed (``safetensors>=0.4.3``), else None.

    The ``pkg`` and ``specs`` groups of the rule that recognised the line say it; only evidence without
    them (a user rule's match, a line wrapped over rows, a journal's text) is read again."""
    groups = evidence.groups
    if "pkg" in groups and "specs" in groups:
        pkg, specs = groups["pkg"], groups["specs"]
    else:
        if not evidence.line:
            return None
        rows = [clean_line(row) for row in evidence.line.split("\n")]  # a message rich or a terminal wrapped
        m = _REQUIRED.search(" ".join(rows)) or _REQUIRED.search("".join(rows))
        if m is None:
            return None
        pkg, specs = m.group("pkg"), m.group("specs")
    return pkg + ",".join(part.replace(" ", "") for part in specs.split(","))


def _name(spec: str) -> str:
    return re.split(r"[<>=!~,\[ ]", spec, maxsplit=1)[0].lower().replace("_", "-")


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def upgrade_spec(action: Action, evidence: Said) -> str:
    """The spec an ``upgrade`` action installs: its own, made to satisfy a requirement the evidence
    printed for the same package too (the higher of two ``>=``, else both specifiers; see
    ``required_spec``)."""
    required = required_spec(evidence)
    if required is None or _name(required) != _name(action.name):
        return action.name
    ours, theirs = action.name[len(_name(action.name)):], required[len(_name(required)):]
    a, b = _AT_LEAST.match(ours), _AT_LEAST.match(theirs)
    if a is not None and b is not None:
        return required if _version(b.group(1)) >= _version(a.group(1)) else action.name
    return action.name + "," + theirs


_TIMEOUT_MS = (re.compile(r"Timeout\(ms\)=(\d+)"), re.compile(r"Timed out waiting (\d+)ms for (?:send|recv)"))


def collective_timeout_s(evidence: Said) -> float | None:
    """The timeout (seconds) a collective timeout's evidence says the process group had, else None.

    The rule's ``ms`` group says it; a line without it (a journal's text, a user rule's match) is read again."""
    ms = evidence.groups.get("ms")
    if ms is None and evidence.line:
        for pattern in _TIMEOUT_MS:
            m = pattern.search(evidence.line)
            if m is not None:
                ms = m.group(1)
                break
    return int(ms) / 1000 if ms is not None else None


def raised_timeout_s(current_s: float | None, default_s: float, evidence: Said, factor: float) -> float:
    """A collective timeout raised ``factor`` times: from the command's setting, else what the evidence
    says the group had, else the trainer's default (the larger of the two: the evidence is the truth)."""
    said = collective_timeout_s(evidence)
    base = current_s if current_s is not None else (said if said is not None else default_s)
    if said is not None:
        base = max(base, said)
    return base * factor
