"""Owns the supervise loop: attempts one after another, the decision after each, remedies, the run's end.

One event queue (``run.events``) and one decision loop; threads only produce events, and every event
goes through ``_dispatch`` wherever the loop waits (an attempt, a backoff, a GPU wait). The run's
resources are ``run.context``'s, the child ``run.attempt``'s, what its output and end mean for the
records ``run.reactions``'; the launch is ``run.launching``'s, the end ``run.ending``'s. The trainer is
asked of its adapter (``trainers.registry``) through the contract in ``trainers.base`` only.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ..faults.rules import BUILTIN_RULES
from ..faults.scanner import FaultScanner
from ..faults.userrules import compose_rules
from ..record import journalkinds as kinds
from ..record.journal import JournalListener
from ..record.progress import ProgressLog
from ..record.runindex import Registrar
from ..sensors import gpu
from ..sensors.watch import FileWatcher
from ..trainers.base import TrainerRun, rung_applies
from . import events as ev
from . import process
from .attempt import Attempt, AttemptResult, AttemptSpec
from .context import open_run, open_trainer_run, say
from .deadline import Deadline
from .decide import EXIT_STOPPED, Decision, History, Outcome, decide, record, stops_at_once
from .ending import end_run, hand_over, stopped_by_signal
from .gpuguard import GpuGuard
from .launching import prepare_launch
from .live import LiveControl
from .policy import Policy
from .reactions import Reactions
from .remedy import Remedier
from .rundir import edited
from .runstate import RunState, check_transition
from .sdnotify import Notifier
from .spec import RunSpec


class Supervisor:
    def __init__(self, spec: RunSpec, policy: Policy, *, clock: Callable[[], float] = time.monotonic,
                 spawn: Callable[..., process.Child] = process.spawn,
                 gpu_probe: Callable[[], gpu.GpuProbe] = gpu.probe,
                 notify_env: Mapping[str, str] = os.environ, listeners: Sequence[JournalListener] = ()) -> None:
        self.spec, self.policy, self.clock, self.spawn, self.gpu_probe = spec, policy, clock, spawn, gpu_probe
        self.listeners = (*listeners, ProgressLog(), Registrar())  # hear the journal: notices, the curve, the index
        self.notifier = Notifier(notify_env, clock)  # systemd's Type=notify; inert outside systemd
        self.reexec_env: dict[str, str] | None = None  # set: the CLI execs a new supervisor with this env
        self.events = ev.new_queue()
        self.state = RunState.STARTING
        self.stop_signal: int | None = None
        self.rules = compose_rules(policy.rules)  # user rules first; an extended built-in replaced in place
        self._live = {r.id for r in self.rules if r.live}
        self.deadline = Deadline(policy.slurm, policy.stop_grace_s, clock, os.environ)  # cli's handler tells it
        self.wait_foreign = False  # an OOM while other programs held memory: the next launch waits for them

    def _compose_rules(self, t: TrainerRun) -> None:
        """The policy's rules first, then the trainer's own, then the built-in table."""
        self.rules = compose_rules(self.policy.rules, t.rules() + BUILTIN_RULES)
        self._live = {r.id for r in self.rules if r.live}

    def request_stop(self, signum: int, trainer_signal: int = signal.SIGTERM) -> None:
        self.stop_signal = signum  # signal handlers call this: it only records (SimpleQueue.put is reentrant)
        self.events.put(ev.StopRequested(signum, trainer_signal))  # why the run stops, what the trainer gets

    def run(self) -> int:
        t = open_trainer_run(self.spec, self.policy)
        if isinstance(t, int):
            return t
        self._compose_rules(t)
        ctx = open_run(self.spec, self.policy, t, self.listeners, self.notifier)
        if isinstance(ctx, int):
            return ctx
        self.ctx, self.history, self.plan = ctx, History(), t.plan
        first = 1 + sum(1 for _ in ctx.run_dir.glob("attempt-*.log"))
        # The baseline of GPU memory is taken now, before anything of this run is launched.
        ctx.gpu = GpuGuard(self.gpu_probe(), self.spec.env.get("CUDA_VISIBLE_DEVICES"), self.policy.gpu,
                           ctx.journal, say, self.clock, self._backoff)
        self.remedier = Remedier(ctx.journal, say, self.spec.env, ctx.run_dir, t)
        self.reactions = Reactions(ctx, self.events, self.deadline, self.clock)
        if t.user_resume is not None:
            problem = ctx.points.adopt(t.user_resume)
            if problem:
                return self._end(Decision(kind="stop", exit_code=EXIT_STOPPED, reason=f"config_error: --resume "
                                          f"{t.user_resume} is not a complete state: {problem}"))
        self.live = LiveControl(t, self.policy, self.spec.policy_path, ctx.journal, say, self.spec.project)
        ctx.watcher = FileWatcher(lambda path, kind: self.events.put(ev.FileChanged(path, kind)),
                                  self.policy.debounce_s)
        self.live.watch(ctx.watcher)
        ctx.watcher.start()
        return self._attempts(first)

    def _attempts(self, attempt: int) -> int:
        """Attempt after attempt until the run ends; its exit code."""
        while True:
            if self.stop_signal is not None:  # asked to stop between two attempts
                return self._end(stopped_by_signal(self.stop_signal))
            result = self._attempt(attempt)
            if isinstance(result, Decision):
                return self._end(result)  # could not start at all
            outcome = self.reactions.conclude(result)
            self._transition(RunState.STOPPING)
            if result.stopped_for_change and outcome.stop_signal is None:
                if self.live.project_next is not None:  # the command was edited: the CLI execs a new supervisor
                    self.reexec_env = hand_over(self.ctx, self.reactions.attempt_no)
                    return 0
                # Stopped on purpose at a checkpoint to apply an edit: relaunch at once, no budget spent.
                self._transition(RunState.STARTING)
            else:
                code = self._after(outcome)
                if code is not None:
                    return code
            attempt += 1

    def _after(self, outcome: Outcome) -> int | None:
        """The decision after a failed attempt, carried out: a remedy and the backoff (``None``: go on),
        or the end of the run (its exit code)."""
        t = self.ctx.trainer
        decision = decide(self.history, outcome, self.policy, self.clock(),
                          functools.partial(rung_applies, t, self.plan, evidence=outcome.said),
                          stops_at_once(self.rules), functools.partial(t.ladder, plan=self.plan))
        record(self.history, outcome, decision, self.clock())
        for index, rung in decision.skipped:
            self.ctx.journal.event(kinds.REMEDY_SKIPPED, **{"class": outcome.fault}, rung=index,
                                   actions=rung.describe(), trainer=t.family,
                                   reason=rung.unfit_reason(outcome.said) or "means nothing for this command")
        if decision.kind != "restart":
            return self._end(decision, outcome.attempt)
        self._transition(RunState.REMEDYING)
        remedied = self.remedier.apply(self.plan, decision, outcome, self.policy, outcome.attempt)
        if remedied.stop is not None:
            return self._end(remedied.stop)
        self.plan, self.wait_foreign = remedied.plan, remedied.wait_foreign
        self._transition(RunState.BACKOFF)
        if self._backoff(decision.delay_s):
            return self._end(stopped_by_signal(self.stop_signal))
        self._transition(RunState.STARTING)
        return None

    # --- one attempt -----------------------------------------------------------------------------
    def _attempt(self, number: int) -> AttemptResult | Decision:
        """One launch followed to its end; a decision instead when it could not start."""
        ctx = self.ctx
        resume = ctx.points.newest(self.reactions.nan_abs_step, ctx.trainer.total_steps, self.plan)
        wait_foreign, self.wait_foreign = self.wait_foreign, False
        if ctx.gpu is not None and ctx.gpu.before_launch(number, wait_foreign=wait_foreign):
            return stopped_by_signal(self.stop_signal)
        spec = prepare_launch(self.ctx, self.plan, self.policy, self.live, self.reactions, number, resume)
        if isinstance(spec, Decision):
            return spec
        if spec.before:
            ended = self._pre_steps(spec, number)
            if ended is not None:
                return ended
        self._transition(RunState.RUNNING)
        attempt = Attempt(spec, FaultScanner(self.rules, ctx.trainer.output), self.events, spawn=self._spawn,
                          clock=self.clock)
        try:
            attempt.start()
        except process.LaunchError as exc:
            self._transition(RunState.STOPPING)
            return Decision(kind="stop", exit_code=EXIT_STOPPED, reason=f"config_error: {exc}")
        try:
            while not attempt.done:
                self._tick()
                event = ev.next_event(self.events, 0.1)
                if event is not None:
                    self._dispatch(event, attempt)
                idle = attempt.poll()
                if idle is not None and attempt.hang_clock is not None:  # the stacks first, then the stop
                    attempt.stop_hung(self.reactions.hang(attempt.pid, idle, attempt.hang_clock, attempt.obs,
                                                          attempt.ranks))
        finally:
            attempt.close()
        return attempt.result(ctx.points.final_written)

    def _pre_steps(self, spec: AttemptSpec, number: int) -> Decision | None:
        """The adapter's programs before the trainer (``Launch.before``), each run to its end with the
        trainer's cwd and environment; a decision instead when one failed or a stop was asked for (the
        trainer is then not launched). Only stops and file edits mean something meanwhile: an edit
        that asks for a relaunch at once is handed on to the trainer's attempt."""
        journal, handed_on = self.ctx.journal, []
        for k, step in enumerate(spec.before, 1):
            log = spec.log_path.parent / "before" / f"attempt-{number}.{k}.log"  # out of attempt-*.log's sight
            say(f"attempt {number}: {step.says} (its output: {log.name})")
            journal.event(kinds.PRE_STEP_START, attempt=number, step=k, argv=list(step.argv), says=step.says,
                          log=str(log))
            run = Attempt(dataclasses.replace(spec, argv=list(step.argv), log_path=log, hang=None, fmt=None, before=(),
                                              watch_ranks=False),
                          FaultScanner(self.rules), self.events, spawn=self.spawn, clock=self.clock)
            started = self.clock()
            try:
                log.parent.mkdir(exist_ok=True)
                run.start()
            except (process.LaunchError, OSError) as exc:
                return Decision(kind="stop", exit_code=EXIT_STOPPED, reason=f"config_error: {step.says}: {exc}")
            try:
                while not run.done:
                    self._tick()
                    event = ev.next_event(self.events, 0.1)
                    match event:
                        case ev.Eof() | ev.StopRequested():
                            run.apply(event)
                        case ev.FileChanged(path=path, kind=kind):
                            self._on_file_changed(path, kind)
                        case ev.StopForChange():
                            handed_on.append(event)
                    run.poll()
            finally:
                run.close()
            result = run.result()
            journal.event(kinds.PRE_STEP_END, attempt=number, step=k, exit_code=result.exit_code,
                          signal=result.signal, seconds=round(self.clock() - started, 1))
            if result.stop_signal is not None or self.stop_signal is not None:
                return stopped_by_signal(self.stop_signal)
            if result.exit_code != 0:
                how = f"exit {result.exit_code}" if result.exit_code is not None else f"signal {result.signal}"
                last = result.evidence.line.strip().splitlines()[-1] if result.evidence and result.evidence.line \
                    else "no output"
                return Decision(kind="stop", exit_code=EXIT_STOPPED,
                                reason=f"config_error: {step.says} failed ({how}): {last} (see {log}); the "
                                       "trainer was not launched")
        for event in handed_on:
            self.events.put(event)
        return None

    def _spawn(self, argv: list[str], env: dict[str, str], cwd: Path | None) -> process.Child:
        child = self.spawn(argv, env, cwd)
        self.reactions.spawned(child.pid)
        assert self.ctx.gpu is not None
        self.ctx.gpu.attach(child, self.events)
        self.deadline.launched(self.ctx.trainer.planned_stop_signal)  # its stop may save a state
        self.notifier.ready()  # systemd: started once the first trainer is launched
        return child

    # --- events ----------------------------------------------------------------------------------
    def _dispatch(self, event: ev.Event, attempt: Attempt | None) -> None:
        """One event, wherever the loop waits: the attempt's part first (``None`` between attempts,
        where a planned stop means nothing: the next launch applies the edit), then the engine's."""
        if attempt is not None:
            attempt.apply(event)
        match event:
            case ev.ProgressSeen(progress=progress):
                self.reactions.progress(progress)
            case ev.FileChanged(path=path, kind=kind):
                self._on_file_changed(path, kind)
            case ev.GpuSampled(samples=samples) if self.ctx.gpu is not None:
                self.ctx.status(gpu=self.ctx.gpu.status_entries(samples))
            case ev.SummarySeen() if attempt is not None:
                self.reactions.summary(attempt.obs)
            case ev.StateDone(path=path) if attempt is not None:
                self.reactions.state_done(path, attempt.obs)
            case ev.RanksFound(ranks=ranks):
                self.reactions.ranks_found(ranks)
            case ev.RankEnded(end=end):
                self.reactions.rank_ended(end)
            case ev.RanksStuckAtExit(pids=pids, waited_s=waited_s):
                self.reactions.ranks_stuck_at_exit(pids, waited_s)
            case ev.EvidenceSeen(evidence=evidence) if evidence.fault in self._live:
                self.reactions.evidence(evidence)
                if attempt is not None:
                    attempt.stop_live(evidence.fault)

    def _on_file_changed(self, path: Path, kind: str) -> None:
        action = self.live.on_change(path, kind, self.plan)  # the adapter updates the plan remedies read
        if action != "none":
            edited(self.ctx.run_dir, self.ctx.trainer)  # an input edited live is still this run
        if action in ("policy", "command"):
            self.policy = self.live.policy
            if self.ctx.gpu is not None:
                self.ctx.gpu.policy = self.policy.gpu
            self._compose_rules(self.ctx.trainer)
        if action == "now":
            self.events.put(ev.StopForChange())
        if action in ("at_checkpoint", "command"):
            self.reactions.stop_at_checkpoint = True

    # --- waiting -----------------------------------------------------------------------------------
    def _backoff(self, delay: float) -> bool:
        """Wait ``delay`` seconds, every event dispatched meanwhile; True when a stop signal arrived."""
        deadline = self.clock() + delay
        while self.stop_signal is None:
            self._tick()
            left = deadline - self.clock()
            if left <= 0:
                return False
            event = ev.next_event(self.events, min(left, 0.2))  # a stop request wakes us at once
            if event is not None:
                self._dispatch(event, None)
        return True

    def _end(self, decision: Decision, attempt: int | None = None) -> int:
        code, self.state = end_run(self.ctx, decision, self.deadline, self.stop_signal, attempt)
        return code

    def _tick(self) -> None:  # every pass of the decision loop: systemd's watchdog, the lease when due
        self.notifier.tick()
        self.ctx.owner.tick(say, self.request_stop)
        self.deadline.tick(self.ctx.journal, say, self.request_stop, self.stop_signal)

    def _transition(self, new: RunState) -> None:
        self.state = check_transition(self.state, new)
        self.ctx.status(state=new.value)
