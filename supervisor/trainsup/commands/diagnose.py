"""Owns ``trainsup diagnose``: classifying saved logs offline and saying what ``trainsup run`` would do.

Each log is read by ``logscan`` with the live supervisor's scanner and rule table (the policy's
user rules first).  The diagnosis names the fault class, the evidence line and its number, the
rule's explanation, the remedy ``trainsup run`` would apply (the first rung of the trainer's ladder
that changes this command, chosen as the engine chooses it; with no command known, the first rung of
the ladder of the family whose own wording or output the log is (``recognised_family``: one of its
rules read the evidence, or its output format alone read lines of the log) when that family has a
ladder that needs no command, else of the trainer-neutral ``remedies.DEFAULT``, which names no
trainer's flags) and, when the trainer's
command is known (from the log, or ``--command``), the corrected command line.  The log is read
with every known adapter's output format (``registry.known_output``): any trainer's progress drops
the evidence training outlived, and any trainer's success line says the run finished.

A clean log is a classification too: no fault.  A log that failed with no rule matching is
``unknown``, and says how: the exception line or signal death it ends with, else (a launcher's
failure report, a traceback cut above its exception) its last lines.  Unreadable input (missing, a directory, no
permission) is reported on one line naming the file; the other files are still classified.

A run dir (or an output dir whose ``.trainsup`` is one) stands for its attempt logs, in the order they
ran. For a log in a run dir, the journal beside it says what the run then did (``journaled_remedy``:
the remedy it applied, a later rung for a later attempt), which is shown instead of what a first
attempt "would" get.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..faults.classes import fault_class, not_restartable
from ..faults.dumps import DUMP_RULES
from ..faults.ending import UNKNOWN_WHY
from ..faults.linetext import clean_line, strip_ansi
from ..faults.logscan import LogScan, scan_file, scan_log
from ..faults.progress import format_name
from ..faults.remedies import Action, Rung, required_spec, stop, upgrade_spec
from ..faults.remedies import ladder as builtin_ladder
from ..faults.rules import BUILTIN_RULES, FaultRule
from ..faults.userrules import compose_rules
from ..faults.verdict import NOTHING_SAID, Evidence, Said
from ..record.journal import read_events
from ..run.decide import select_rung, stops_at_once
from ..trainers.base import Plan, Setup, TrainerFamily, TrainerRun, rung_applies
from ..trainers.interpreter import upgrade_command
from ..trainers.registry import families, family_rules, known_output, open_run

_ATTEMPT_LOG = re.compile(r"^attempt-(\d+)\.log$")

__all__ = ["Diagnosis", "diagnose_path", "diagnose_scan", "expand_paths", "journaled_remedy", "plan_remedy",
           "run_diagnose"]

EXIT_OK = 0
EXIT_UNREADABLE = 2
_LAST_LINES = 3  # lines an unknown failure with no exception line of its own shows
_TEXT_EVIDENCE = 400  # characters of the evidence line shown in text output (JSON has it all)


@dataclass
class Diagnosis:
    file: str
    fault: str | None = None
    evidence: str | None = None
    line: int | None = None
    explanation: str | None = None
    remedy: list[str] = field(default_factory=list)
    command: str | None = None  # the command trainsup run would launch next, when known
    command_changed: bool = False
    command_source: str | None = None  # "log" or "--command"
    notes: list[str] = field(default_factory=list)
    success: bool = False
    applied: str | None = None  # what the run did after this attempt, from the journal beside the log

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {"file": self.file, "fault": self.fault, "evidence": self.evidence,
                                  "line": self.line, "explanation": self.explanation, "remedy": self.remedy}
        if self.applied is not None:
            out["applied"] = self.applied
        if self.command is not None:
            out["command"] = self.command
            out["command_source"] = self.command_source
            out["command_changed"] = self.command_changed
        return out


@dataclass(frozen=True)
class Known:
    """A command as its trainer adapter reads it (exactly as given), and the plan to correct."""

    trainer: TrainerRun
    plan: Plan

    def copy(self) -> Known:
        return Known(self.trainer, self.plan.copy())


@dataclass(frozen=True)
class Remedy:
    rung: Rung | None
    changes: list[str]
    plan: Known | None  # the corrected plan, when a command was given
    relaunch: bool  # trainsup run would launch again (False: it stops)


def _pip(action: Action, known: Known | None, evidence: Said) -> tuple[str, str]:
    """The package spec an upgrade installs, and the pip command in the trainer's interpreter."""
    spec = known.trainer.upgrade_spec(action, evidence) if known is not None else upgrade_spec(action, evidence)
    python = known.trainer.python({}) if known is not None else None
    return spec, " ".join(upgrade_command(python or "<trainer's python>", shlex.quote(spec)))


Ladder = Callable[[str], tuple[Rung, ...]]


def recognised_family(scan: LogScan, evidence: Evidence | None) -> TrainerFamily | None:
    """The family whose log this is, when the log says: one of the family's own rules reads the
    evidence line, else its output format is the only one that read lines of the log (progress,
    success). None: no family's, or several formats (a log of two trainers)."""
    known = families()
    if evidence is not None:
        rows = [clean_line(row) for row in evidence.line.split("\n")]
        for family in known.values():
            for rule in family.rules():
                if rule.id == evidence.fault and any(re.search(p, row) for p in rule.patterns for row in rows):
                    return family
    by_format = [f for f in known.values() if format_name(f.output()) in scan.recognised]
    return by_format[0] if len(by_format) == 1 else None


def family_ladder(family: TrainerFamily | None) -> Ladder | None:
    """A family's ladder for a log without its command (``TrainerFamily``'s optional ``ladder``:
    only a family whose ladder needs no command has one)."""
    ladder: Ladder | None = getattr(family, "ladder", None)
    return ladder if callable(ladder) else None


def plan_remedy(fault: str, plan: Known | None, evidence: Said = NOTHING_SAID,
                apply_to: Known | None = None, allow_upgrade: bool = True,
                fatal: frozenset[str] = not_restartable(), family: Ladder | None = None) -> Remedy:
    """The remedy trainsup run would apply after this fault on a first attempt.

    ``evidence``: the fault's line and its rule's named groups (``Said(text)`` for text alone).
    ``plan`` decides which rung applies (without one, the first); the rung is then applied to
    ``apply_to`` (default: ``plan``) for the corrected command.  Without ``allow_upgrade``
    (the policy's ``environment.allow_upgrade``) an upgrade rung stops, printing the command.
    With no command known, ``family`` is the ladder of the trainer the log was recognised as
    (``recognised_family``); else the trainer-neutral one.
    """
    rung: Rung | None
    known = plan or apply_to
    ladder = known.trainer.ladder if known is not None else family or builtin_ladder
    if fault in fatal:
        rung = ladder(fault)[0] if not fault_class(fault).restartable else stop("its rule says a restart cannot fix it")
    else:
        # Without a command every rung may apply: say what the first one does.
        chosen = select_rung(fault, 0, (lambda r: rung_applies(plan.trainer, plan.plan, r, evidence))
                             if plan is not None else (lambda r: r.fits(evidence)), ladder)
        rung = chosen[1] if chosen is not None else None
    if rung is None:
        return Remedy(None, ["stop: no remedy left that changes this command"], None, False)
    target = apply_to if apply_to is not None else plan
    new = target.copy() if target is not None else None
    changes: list[str] = []
    for action in rung.actions:
        change = None
        if action.kind == "upgrade":
            spec, pip = _pip(action, new, evidence)
            if not allow_upgrade:  # the engine stops there, printing the command
                why = "stop: the policy forbids upgrades (environment.allow_upgrade: false); run: "
                return Remedy(rung, [why + pip], None, False)
            change = f"upgrade {spec} in the trainer's interpreter: {pip}"
        elif new is not None and action.kind not in ("restart", "stop"):
            try:
                change = new.trainer.apply(new.plan, action, evidence)
            except (ValueError, OSError):
                change = None
        if plan is None or action.kind in ("upgrade", "restart", "stop"):
            change = change or action.describe()  # not judged against a command: say what it does
        if change is not None:
            changes.append(change)
    relaunch = not any(a.kind == "stop" for a in rung.actions)
    return Remedy(rung, changes, new if relaunch else None, relaunch)


def command_text(known: Known) -> str:
    """The plan as one shell line: environment assignments, then the argv."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(known.plan.env.items()))
    return (env + " " if env else "") + shlex.join(known.trainer.command_line(known.plan))


def build_plan(argv: list[str]) -> Known:
    """A plan for a command exactly as the user gave it; files it names are read where they exist
    here. Raises ``ValueError`` (``UsageError``) for a command no adapter can read."""
    trainer = open_run(Setup(tuple(argv), Path.cwd(), as_given=True))
    return Known(trainer, trainer.plan)


def _explanation(fault: str, rules: Sequence[FaultRule]) -> str:
    for rule in rules:
        if rule.id == fault:
            return rule.explanation
    return UNKNOWN_WHY if fault == "unknown" else ""


def _attempt_journal(path: Path) -> tuple[int, list[dict[str, Any]]] | None:
    """For a run dir's ``attempt-N.log``: N and the journal beside it; None for another file."""
    m = _ATTEMPT_LOG.match(path.name)
    if m is None:
        return None
    try:
        return int(m.group(1)), read_events(path.parent)
    except (OSError, ValueError):
        return None


def journaled_ending(path: Path) -> tuple[str, str] | None:
    """For a run dir's ``attempt-N.log``: the fault trainsup journaled for attempt N and how the
    trainer ended, from ``events.jsonl`` beside it. A trainer killed outright prints nothing about
    it (accelerate does; a bare trainer does not): only the supervisor saw the signal."""
    found = _attempt_journal(path)
    if found is None:
        return None
    attempt, events = found
    fault = next((e for e in events if e.get("event") == "fault" and e.get("attempt") == attempt), None)
    end = next((e for e in events if e.get("event") == "attempt_end" and e.get("attempt") == attempt), {})
    if fault is None or not isinstance(fault.get("class"), str):
        return None
    sig = end.get("signal") or end.get("child_signal")
    how = f"signal {sig}" if sig else f"exit {end.get('exit_code')}"
    rank = end.get("rank_ended")
    who = f" as its rank {rank} did," if isinstance(rank, int) else f" as its {rank} did," if rank else ""
    return fault["class"], f"(the run's journal: attempt {attempt} ended{who} by {how})"


def journaled_remedy(path: Path) -> str | None:
    """For a run dir's ``attempt-N.log``: what the run did after attempt N, from ``events.jsonl``
    beside it (the remedy it applied, and the attempt it launched; or how the run ended). A later
    attempt's remedy is a later rung of the ladder: only the journal knows which one ran."""
    found = _attempt_journal(path)
    if found is None:
        return None
    attempt, events = found
    ended = next((i for i, e in enumerate(events) if e.get("event") == "attempt_end" and e.get("attempt") == attempt),
                 None)
    if ended is None:
        return None
    for e in events[ended + 1:]:
        kind = e.get("event")
        if kind == "remedy":
            actions = "; ".join(str(a) for a in e.get("actions") or []) or "the same command again"
            rung = e.get("rung")
            which = (f"remedy {rung + 1} for {e.get('class')}" if isinstance(rung, int)
                     else f"the {e.get('class')} remedy")
            return f"{actions} ({which}), then attempt {attempt + 1}"
        if kind == "attempt_start":
            return f"attempt {e.get('attempt')} started with no remedy (an edit or a planned relaunch)"
        if kind == "finished":
            return f"nothing more: the run finished ({e.get('reason')})"
        if kind == "gave_up":
            return f"nothing more: the run ended, exit {e.get('exit_code')} ({e.get('reason')})"
    return None


def diagnose_scan(name: str, scan: LogScan, rules: Sequence[FaultRule] = BUILTIN_RULES,
                  command: list[str] | None = None, allow_upgrade: bool = True,
                  journaled: tuple[str, str] | None = None) -> Diagnosis:
    """The diagnosis of one scanned log; ``journaled``: what the run's journal says of its end,
    used when the log itself holds no evidence, or only a collective's failure the journal explains
    otherwise."""
    diagnosis = Diagnosis(name, success=scan.success)
    verdict = scan.verdict
    groups: Mapping[str, str] = {}  # the named groups of the rule that recognised the evidence
    # A collective's failure gives way to the journal's other ending: the attempt's rank watch saw the rank
    # that was the cause (killed -9: the log holds only the other ranks' lost peer).
    overruled = (verdict is not None and verdict.consequence and journaled is not None
                 and journaled[0] != verdict.fault)
    if verdict is not None and (not scan.success or verdict.live) and not overruled:
        # A run that finished is clean whatever it printed on the way; only a live fault counts.
        diagnosis.fault, diagnosis.line = verdict.fault, verdict.lineno
        diagnosis.evidence, groups = strip_ansi(verdict.line), verdict.groups
    elif journaled is not None and not scan.success:
        diagnosis.fault, diagnosis.evidence = journaled
    elif scan.failed:
        diagnosis.fault = "unknown"
        shown = scan.last_lines[-_LAST_LINES:]
        if shown:  # no exception line of its own: what the log ends with
            diagnosis.evidence = "\n".join(strip_ansi(line) for line, _ in shown)
            diagnosis.line = shown[0][1]
    if diagnosis.fault is None:
        return diagnosis
    # The rule that matched explains it (several rules share a fault id: an adapter's own wording).
    diagnosis.explanation = (verdict.explanation if verdict is not None and verdict.fault == diagnosis.fault
                             and verdict.explanation else _explanation(diagnosis.fault, rules))
    said = Said(diagnosis.evidence, groups)  # a journal's or a bare log's evidence: its text alone
    required = required_spec(said) if diagnosis.fault == "missing_dependency" else None
    if required is not None:  # an import-time version check names exactly what to install
        diagnosis.explanation += (f" It needs {required}: run pip install {shlex.quote(required)} "
                                  "in the trainer's environment.")
    argv, source = (command, "--command") if command is not None else (scan.command, "log")
    plan = None
    if argv is not None:
        try:
            plan = build_plan(argv)
        except ValueError as exc:
            diagnosis.notes.append(f"the command line found in the log is not usable: {exc}")
    if plan is not None and plan.trainer.settings_unknown:
        # Settings in a file that is not on this machine are unknown: say what the first rung
        # does instead of judging it inapplicable.
        diagnosis.notes.extend(plan.trainer.notes)
        remedy = plan_remedy(diagnosis.fault, None, said, plan, allow_upgrade, stops_at_once(rules))
    else:
        family = family_ladder(recognised_family(scan, verdict)) if plan is None else None
        remedy = plan_remedy(diagnosis.fault, plan, said, allow_upgrade=allow_upgrade,
                             fatal=stops_at_once(rules), family=family)
    diagnosis.remedy = remedy.changes
    if plan is not None and remedy.plan is not None:
        diagnosis.command = command_text(remedy.plan)
        diagnosis.command_changed = diagnosis.command != command_text(plan)
        diagnosis.command_source = source
        diagnosis.notes.extend(remedy.plan.trainer.plan_notes(remedy.plan.plan))
    elif plan is None:
        diagnosis.notes.append("no command line found in the log; give it with --command to get it corrected")
    return diagnosis


def diagnose_path(path: str, rules: Sequence[FaultRule], command: list[str] | None,
                  allow_upgrade: bool = True) -> Diagnosis:
    """Diagnose a file, or stdin for ``-``.  Raises OSError when the input cannot be read."""
    if path == "-":
        return diagnose_scan("-", scan_log(sys.stdin.buffer, rules, progress=known_output()), rules, command,
                             allow_upgrade)
    diagnosis = diagnose_scan(path, scan_file(path, rules, progress=known_output()), rules, command, allow_upgrade,
                              journaled_ending(Path(path)))
    if diagnosis.fault is not None:
        diagnosis.applied = journaled_remedy(Path(path))
    return diagnosis


def expand_paths(paths: Sequence[str]) -> list[str]:
    """The logs to read: a run dir (or an output dir with its ``.trainsup``) stands for its attempt
    logs, in the order they ran; anything else is read as given (a directory then fails as one)."""
    out: list[str] = []
    for given in paths:
        folder = Path(given)
        if given == "-" or not folder.is_dir():
            out.append(given)
            continue
        run_dir = folder if any(folder.glob("attempt-*.log")) else folder / ".trainsup"
        numbered = [(int(m.group(1)), p) for p in run_dir.glob("attempt-*.log") if (m := _ATTEMPT_LOG.match(p.name))]
        if numbered:
            out.extend(str(p) for _, p in sorted(numbered))
        else:
            out.append(given)
    return out


def format_text(d: Diagnosis) -> str:
    if d.fault is None:
        why = "the run finished (its trainer's success line)" if d.success else "no fault found in the log"
        return f"{d.file}: no fault: {why}"
    head = f"{d.file}: {d.fault}" + (f" at line {d.line}" if d.line is not None else " (no evidence line)")
    out = [head]
    if d.evidence is not None:
        rows = d.evidence.split("\n")
        first = rows[0] if len(rows[0]) <= _TEXT_EVIDENCE else rows[0][:_TEXT_EVIDENCE] + "…"
        out.append(f"  evidence: {first.strip()}")
        out.extend(f"            {row.strip()}" for row in rows[1:])
    if d.explanation:
        out.append(f"  why: {d.explanation}")
    if d.applied is not None:  # the run's journal says what it did: a later attempt's rung is not the first
        out.append(f"  the run applied: {d.applied}")
    else:
        out.append(f"  trainsup run would: {'; '.join(d.remedy)}")
    if d.command is not None and d.command_changed:
        out.append(f"  corrected command: {d.command}")
    out.extend(f"  note: {n}" for n in d.notes)
    return "\n".join(out)


def run_diagnose(paths: Sequence[str], *, as_json: bool, command: str | None, policy: Path | None,
                 out: TextIO, err: TextIO) -> int:
    """The verb: returns 0 when every input was classified, 2 when one could not be read (or the
    options are bad)."""
    from ..run.policy import PolicyError, load_policy

    try:
        loaded = load_policy(policy)
    except PolicyError as exc:
        print(f"trainsup diagnose: error: {exc}", file=err)
        return EXIT_UNREADABLE
    # User rules first, as trainsup run composes them; then every adapter's own, the stack dumps of a
    # hung run (a pasted log's evidence of a hang), then the built-ins.
    rules = compose_rules(loaded.rules, family_rules() + DUMP_RULES + BUILTIN_RULES)
    argv = None
    if command is not None:
        try:
            argv = shlex.split(command)
            build_plan(argv)
        except ValueError as exc:
            print(f"trainsup diagnose: error: --command: {exc}", file=err)
            return EXIT_UNREADABLE
    code = EXIT_OK
    printed = False
    for path in expand_paths(paths):
        try:
            diagnosis = diagnose_path(path, rules, argv, loaded.allow_upgrade)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            print(f"trainsup diagnose: error: cannot read {path}: {reason}", file=err)
            if as_json:
                print(json.dumps({"file": path, "error": reason}), file=out)
            code = EXIT_UNREADABLE
            continue
        if as_json:
            print(json.dumps(diagnosis.as_json(), ensure_ascii=False), file=out)
        else:
            print(("\n" if printed else "") + format_text(diagnosis), file=out)  # a blank line between logs
            printed = True
        out.flush()
    return code
