"""Owns carrying out a decided rung: edits of the launch plan, the serializer upgrade, and the
note that the next launch must first wait for other programs' GPU memory.

The decision (``run.decide``) says which rung; this module changes a copy of the plan, journals
``remedy`` with what it did, and says it on the console. A rung that cannot be carried out (the
upgrade is forbidden or fails) becomes a stop with the command the user can run instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..record import journalkinds as kinds
from ..record.journal import Journal
from ..trainers.base import Plan, TrainerRun
from ..trainers.interpreter import run_upgrade, upgrade_command
from .decide import EXIT_STOPPED, Decision, Outcome
from .policy import Policy
from .sentences import remedy_sentence


@dataclass(frozen=True)
class Remedied:
    plan: Plan
    stop: Decision | None = None  # the rung could not be carried out
    wait_foreign: bool = False  # the next launch waits for other programs to free GPU memory


@dataclass
class Remedier:
    journal: Journal
    say: Callable[[str], None]
    env: Mapping[str, str]  # the trainer's environment: which Python runs it
    run_dir: Path
    trainer: TrainerRun  # what the rung's actions mean for this trainer

    def apply(self, plan: Plan, decision: Decision, outcome: Outcome, policy: Policy,
              attempt: int) -> Remedied:
        assert decision.rung is not None
        new = plan.copy()
        done: list[str] = []
        wait_foreign = False
        for action in decision.rung.actions:
            if action.kind == "upgrade":
                spec = self.trainer.upgrade_spec(action, outcome.said)
                stop = self._upgrade(new, spec, policy, attempt)
                if stop is not None:
                    return Remedied(plan, stop)
                done.append(f"upgraded {spec}")
                continue
            wait_foreign = wait_foreign or action.kind == "wait_foreign"
            change = self.trainer.apply(new, action, outcome.said)
            if change is not None:
                done.append(change)
        self.journal.event(kinds.REMEDY, **{"class": outcome.fault}, rung=decision.rung_index, actions=done,
                           delay_s=round(decision.delay_s, 3))
        self.say(remedy_sentence(outcome.fault or "unknown", decision.rung_index, done, attempt + 1, decision.delay_s))
        return Remedied(new, None, wait_foreign)

    def _upgrade(self, plan: Plan, spec: str, policy: Policy, attempt: int) -> Decision | None:
        python = self.trainer.python(self.env)
        command = " ".join(upgrade_command(python or "<trainer's python>", f'"{spec}"'))
        if python is None:
            return Decision(kind="stop", exit_code=EXIT_STOPPED,
                            reason=f"fp8_serializer: cannot tell which Python runs the trainer; run: {command}")
        if not policy.allow_upgrade:
            return Decision(kind="stop", exit_code=EXIT_STOPPED, reason=f"fp8_serializer: the trainer's safetensors "
                            f"is too old and the policy forbids upgrades; run: {command}")
        self.say(f"upgrading the trainer's serializer (environment.allow_upgrade=true): {command}")
        rc = run_upgrade(python, spec, self.run_dir / f"upgrade-{attempt}.log")
        self.journal.event(kinds.ENVIRONMENT_UPGRADE, python=python, spec=spec, exit_code=rc)
        if rc != 0:
            return Decision(kind="stop", exit_code=EXIT_STOPPED,
                            reason=f"fp8_serializer: `{command}` failed (exit {rc})")
        return None
