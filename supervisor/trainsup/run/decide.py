"""Owns the pure decision after an attempt ends: finish, restart with which rung, stop, or give up.

``decide(history, outcome, policy, now, applicable)`` does no I/O; ``applicable`` tells whether a
rung would change anything for this command (the engine dry-runs it on a copy of the plan).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from ..faults.classes import fault_class, not_restartable
from ..faults.remedies import RESTART, WAIT_FOREIGN, Rung
from ..faults.remedies import ladder as builtin_ladder
from ..faults.rules import FaultRule
from ..faults.verdict import Said
from ..sensors.hang import hang_spot
from .policy import Policy

EXIT_GAVE_UP = 3
EXIT_STOPPED = 4


@dataclass(frozen=True, kw_only=True)
class Outcome:
    attempt: int
    exit_code: int | None
    signal: int | None
    child_status: int | None
    child_signal: int | None
    uptime_s: float
    fault: str | None  # None: training finished
    evidence: str | None
    evidence_line: int | None
    steps_trained: int  # optimizer steps this attempt made
    step: int | None = None  # the run's step it ended at (absolute), where known
    saved_new_state: bool
    ended_at: float  # the clock of the decision loop
    stop_signal: int | None = None  # trainsup itself was told to stop
    foreign_mib: int = 0  # memory other programs held on the trainer's GPUs at the last reading
    same_settings: bool = False  # a restart must not change a setting (a SIGKILL not for memory)
    # The named groups of the rule that recognised the evidence (``Evidence.groups``): what the remedy
    # reads before it would parse ``evidence`` again.
    evidence_groups: Mapping[str, str] = field(default_factory=dict)

    @property
    def said(self) -> Said:
        """The evidence as a remedy reads it: the line and its rule's named groups."""
        return Said(self.evidence, self.evidence_groups)


@dataclass
class History:
    outcomes: list[Outcome] = field(default_factory=list)
    restarts_at: list[float] = field(default_factory=list)
    next_rung: dict[str, int] = field(default_factory=dict)
    failures_since_state: int = 0  # drives the backoff; a newly saved state resets it
    quick_exits: int = 0
    waited_foreign: bool = False  # the last restart waited for other programs' GPU memory


Kind = Literal["finish", "restart", "stop", "give_up", "signal"]


@dataclass(frozen=True, kw_only=True)
class Decision:
    kind: Kind
    exit_code: int | None = None
    reason: str = ""
    rung: Rung | None = None
    rung_index: int | None = None
    delay_s: float = 0.0
    quick: bool = False  # the attempt died before training a step, fast, on a plain restart
    skipped: tuple[tuple[int, Rung], ...] = ()  # rungs passed over: they mean nothing for this command


Ladder = Callable[[str], tuple[Rung, ...]]


def select_rung(fault: str, start: int, applicable: Callable[[Rung], bool],
                ladder: Ladder = builtin_ladder) -> tuple[int, Rung] | None:
    """The ladder rung to apply: from ``start``, skipping rungs that would change nothing here."""
    chosen, _skipped = _select(fault, start, applicable, ladder)
    return chosen


def _select(fault: str, start: int, applicable: Callable[[Rung], bool],
            ladder: Ladder) -> tuple[tuple[int, Rung] | None, tuple[tuple[int, Rung], ...]]:
    rungs = ladder(fault)
    index = start
    skipped: list[tuple[int, Rung]] = []
    while index < len(rungs) and not applicable(rungs[index]):
        skipped.append((index, rungs[index]))
        index += 1
    return ((index, rungs[index]) if index < len(rungs) else None), tuple(skipped)


def stops_at_once(rules: Iterable[FaultRule]) -> frozenset[str]:
    """Fault ids a restart cannot fix: the fault table's and any rule's that says restartable: false."""
    return not_restartable(rules)


def decide(history: History, outcome: Outcome, policy: Policy, now: float,
           applicable: Callable[[Rung], bool], fatal: frozenset[str] = not_restartable(),
           ladder: Ladder = builtin_ladder) -> Decision:
    if outcome.stop_signal is not None:
        return Decision(kind="signal", exit_code=128 + outcome.stop_signal,
                        reason=f"stopped by {signal.Signals(outcome.stop_signal).name}")
    if outcome.fault is None:
        return Decision(kind="finish", exit_code=0, reason="training finished")
    fault = outcome.fault
    if fault in fatal:
        reason = _stop_reason(fault, ladder(fault)[0]) if not fault_class(fault).restartable and ladder(fault) else \
            f"{fault}: its rule says a restart cannot fix it"
        return Decision(kind="stop", exit_code=EXIT_STOPPED, reason=reason)

    spot = hang_spot(outcome.evidence, outcome.evidence_groups) if fault_class(fault).repeats_at_same_spot else None
    if spot is not None and any(o.fault == fault and hang_spot(o.evidence, o.evidence_groups) == spot
                                for o in history.outcomes):
        return Decision(kind="stop", exit_code=EXIT_STOPPED,
                        reason=f"{fault}: it hung again {spot}; a restart will not get past it "
                        "(the stacks are in the run dir's hang-N.txt)")
    again = _same_step_again(history, outcome, applicable, ladder)
    if again is not None:
        return Decision(kind="stop", exit_code=EXIT_STOPPED, reason=again)

    recent = [t for t in history.restarts_at if now - t < policy.restart_window_s]
    if len(recent) >= policy.restart_max:
        return Decision(kind="give_up", exit_code=EXIT_GAVE_UP,
                        reason=f"restart budget exhausted: {len(recent)} restarts within "
                        f"{policy.restart_window_s:g} s (restart.max={policy.restart_max}); last fault {fault}")

    if (fault_class(fault).memory == "gpu" and outcome.foreign_mib >= policy.gpu.foreign_warn_mib
            and not history.waited_foreign):
        # Out of memory while other programs held some of it: not this command's fault, maybe.
        index, rung = history.next_rung.get(fault, 0), WAIT_FOREIGN
        skipped: tuple[tuple[int, Rung], ...] = ()
    elif outcome.same_settings:
        # Nothing to remedy: the same command again, and the ladder stays where it was.
        index, rung, skipped = history.next_rung.get(fault, 0), RESTART, ()
    else:
        chosen, skipped = _select(fault, history.next_rung.get(fault, 0), applicable, ladder)
        if chosen is None:
            return Decision(kind="stop", exit_code=EXIT_STOPPED,
                            reason=f"{fault}: no remedy left that changes this command", skipped=skipped)
        index, rung = chosen
    if any(a.kind == "stop" for a in rung.actions):
        return Decision(kind="stop", exit_code=EXIT_STOPPED, reason=_stop_reason(fault, rung), rung=rung,
                        rung_index=index, skipped=skipped)

    quick = outcome.uptime_s < policy.min_uptime_s and outcome.steps_trained == 0
    if quick and rung.repeat and history.quick_exits + 1 >= policy.max_quick_exits:
        return Decision(kind="give_up", exit_code=EXIT_GAVE_UP,
                        reason=f"exited too quickly {history.quick_exits + 1} times in a row "
                        f"(under {policy.min_uptime_s:g} s, no step trained); last fault {fault}")
    failures = 0 if outcome.saved_new_state else history.failures_since_state
    delay = min(policy.backoff_max_s, policy.backoff_initial_s * policy.backoff_factor ** failures)
    return Decision(kind="restart", reason=f"{fault}: {rung.describe()}", rung=rung, rung_index=index, delay_s=delay,
                    quick=quick and rung.repeat, skipped=skipped)


def _same_step_again(history: History, outcome: Outcome, applicable: Callable[[Rung], bool],
                     ladder: Ladder) -> str | None:
    """Why to stop a fault that recurs at the same step with nothing left to change (a class that
    ``repeats_at_same_step``), else None: a restart would meet the same wall again."""
    fault = outcome.fault
    if not fault or not fault_class(fault).repeats_at_same_step or outcome.step is None:
        return None
    if not any(o.fault == fault and o.step == outcome.step for o in history.outcomes):
        return None
    changes = [r for r in ladder(fault)[history.next_rung.get(fault, 0):]
               if any(a.kind not in ("restart", "stop") for a in r.actions) and applicable(r)]
    if changes:
        return None
    return fault_class(fault).same_step_reason.format(fault=fault, step=outcome.step)


def record(history: History, outcome: Outcome, decision: Decision, now: float) -> None:
    """Fold an outcome and the decision taken into the history (the engine calls this once each)."""
    history.outcomes.append(outcome)
    history.waited_foreign = decision.rung is WAIT_FOREIGN
    if decision.kind != "restart" or decision.rung is None or decision.rung_index is None:
        return
    history.restarts_at.append(now)
    fault = outcome.fault or "unknown"
    history.next_rung[fault] = decision.rung_index if decision.rung.repeat else decision.rung_index + 1
    history.failures_since_state = 1 if outcome.saved_new_state else history.failures_since_state + 1
    history.quick_exits = history.quick_exits + 1 if decision.quick else 0


def _stop_reason(fault: str, rung: Rung) -> str:
    for action in rung.actions:
        if action.kind == "stop" and action.value:
            return f"{fault}: {action.value}"
    return fault
