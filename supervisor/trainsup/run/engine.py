"""Owns the supervise loop: attempts, decisions, remedies, resume points, and the run's end.

One event queue and one decision loop; threads only produce events. What the trainer is (its
command, states, output lines, inputs and remedy ladders) the engine asks of the trainer adapter
chosen for the command (``trainers.registry``), through the contract in ``trainers.base`` only.
"""
from __future__ import annotations

import errno
import functools
import math
import os
import queue
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..faults.matchers import Progress
from ..faults.rules import BUILTIN_RULES
from ..faults.scanner import Evidence, FaultScanner
from ..faults.userrules import compose_rules
from ..record.journal import Journal, JournalListener
from ..record.ledger import Ledger, StateRecord
from ..record.progress import ProgressLog
from ..record.runindex import Registrar
from ..record.textfmt import shown_path
from ..sensors import gpu
from ..sensors.hang import HangClock
from ..sensors.oomkills import NOT_FOR_MEMORY, killed_for_memory, oom_kills
from ..sensors.watch import FileWatcher
from ..trainers.base import Plan, Setup, UsageError, rung_applies
from ..trainers.registry import open_run
from . import process, trainedwith
from .attempt import AttemptHooks, AttemptResult, run_attempt, take_hang_stacks
from .console import CONSOLE
from .deadline import Deadline
from .decide import EXIT_STOPPED, Decision, History, Outcome, decide, record, stops_at_once
from .gpuguard import GpuGuard
from .live import LiveControl
from .observe import Observations
from .ownership import Refused, claim
from .policy import Policy
from .remedy import Remedier
from .rundir import HANDED_OVER_ENV, IdentityError, edited, find_home, record_identity, refusal
from .runstate import RunState, check_transition
from .sdnotify import Notifier, status_line
from .sentences import end_sentence, fault_sentence, progress_sentence
from .spec import CHILD_ENV_DEFAULTS, SUPERVISOR_ONLY_ENV, RunSpec
from .takeover import forget_trainer, record_trainer, take_over

STATUS_INTERVAL_S = 0.25
STATES_INTERVAL_S = 0.5  # how often to look on disk for new states when the trainer does not announce them
QUIET_PROGRESS_S = 60.0  # --quiet: a line on the progress this often (and one at each save)


class Supervisor:
    def __init__(self, spec: RunSpec, policy: Policy, *, clock: Callable[[], float] = time.monotonic,
                 spawn: Callable[..., process.Child] = process.spawn,
                 gpu_probe: Callable[[], gpu.GpuProbe] = gpu.probe,
                 notify_env: Mapping[str, str] = os.environ, listeners: Sequence[JournalListener] = ()) -> None:
        self.spec = spec
        # hear the journal: notifications, metrics, the curve, the box's index of runs (status, the page)
        self.listeners = (*listeners, ProgressLog(), Registrar())
        self.policy = policy
        self.clock = clock
        self.spawn = spawn
        self.gpu_probe = gpu_probe
        self.notifier = Notifier(notify_env, clock)  # systemd's Type=notify; inert outside systemd
        self.reexec_env: dict[str, str] | None = None  # set: the CLI execs a new supervisor with this env
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.state = RunState.STARTING
        self.stop_signal: int | None = None
        self._status_written = float("-inf")
        self._states_looked = float("-inf")
        self._progress_said = float("-inf")  # --quiet: when the last progress line was said
        self.rules = compose_rules(policy.rules)  # user rules first; an extended built-in replaced in place
        self._live = {r.id for r in self.rules if r.live}
        self.deadline = Deadline(policy.slurm, policy.stop_grace_s, clock, os.environ)  # cli's handler tells it

    def _compose_rules(self) -> None:
        """The policy's rules first, then the trainer's own, then the built-in table."""
        self.rules = compose_rules(self.policy.rules, self.trainer.rules() + BUILTIN_RULES)
        self._live = {r.id for r in self.rules if r.live}

    # --- signals: handlers only record -----------------------------------------------------------
    def request_stop(self, signum: int, trainer_signal: int = signal.SIGTERM) -> None:
        self.stop_signal = signum
        self.events.put(("signal", (signum, trainer_signal)))  # why the run stops, what the trainer gets

    # --- the run ---------------------------------------------------------------------------------
    def run(self) -> int:
        try:
            trainer = self.spec.trainer if self.spec.trainer is not None else \
                (self.spec.project.trainer if self.spec.project else None)
            self.trainer = open_run(Setup(tuple(self.spec.argv), self.spec.cwd, self.policy.trainer_settings()),
                                    trainer)
        except UsageError as exc:
            self.say(f"error: {exc}")
            return 2
        t = self.trainer
        self._compose_rules()
        try:
            home = find_home(t, self.spec.run_dir, self.spec.cwd, self.spec.start, os.environ)
        except IdentityError as exc:
            self.say(f"error: {exc}")
            return 2
        self.run_dir = home.run_dir
        refused = refusal(home, t, Ledger.load(self.run_dir / "ledger.json"), self.spec.start)
        if refused is not None:  # before the run dir is made or locked: nothing is left behind
            self.say(refused[1] if refused[0] == 0 else f"error: {refused[1]}")
            return refused[0]
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.owner = claim(self.run_dir, self.policy.lease_stale_s)  # the lock, and the lease other hosts see
        except Refused as exc:
            self.say(f"error: {exc}")
            return 2
        except OSError as exc:
            self.say(f"error: cannot use run dir {self.run_dir}: {exc}")
            return 2
        record_identity(home, t)
        self.journal = Journal(self.run_dir)
        for listener in self.listeners:
            self.journal.listen(listener)
        self.owner.journal_takeover(self.journal, self.say)
        take_over(self.run_dir, self.journal, self.say, self.policy.stop_grace_s, self.owner.me)  # a dead one's run
        self.ledger = Ledger.load(self.run_dir / "ledger.json")
        self.history = History()
        self.nan_abs_step: int | None = None
        t.bind(self.run_dir, self.ledger, self.journal, self.say)
        self.points = t.states
        self.points.continue_ledger()
        first = 1 + sum(1 for _ in self.run_dir.glob("attempt-*.log"))
        project = self.spec.project.name if self.spec.project else t.label or self.run_dir.name
        self.journal.event("run_start", argv=list(self.spec.argv), run_dir=str(self.run_dir), policy=self.policy.source,
                           project=project, trainer=t.family, samples=t.samples_record())
        self._status(trainer=t.family)
        separate = home.choice.note(home.identity) if home.choice is not None else None
        if separate is not None:
            self.say(separate)
            self.journal.event("run_separate", note=separate,
                               others=[str(o.run_dir) for o in home.choice.others] if home.choice else [])
        for note in t.notes:
            self.say(note)
            self.journal.event("plan_adjusted", note=note)
        # The baseline of GPU memory is taken now, before anything of this run is launched.
        self.gpu = GpuGuard(self.gpu_probe(), self.spec.env.get("CUDA_VISIBLE_DEVICES"), self.policy.gpu,
                            self.journal, self.say, self.clock, self._backoff)
        self.remedier = Remedier(self.journal, self.say, self.spec.env, self.run_dir, t)
        self.wait_foreign = False  # an OOM while other programs held memory: wait for them first
        if t.user_resume is not None:
            problem = self.points.adopt(t.user_resume)
            if problem:
                return self._end(Decision("stop", EXIT_STOPPED, f"config_error: --resume {t.user_resume} "
                                          f"is not a complete state: {problem}"))
        self.plan = t.plan
        self.live = LiveControl(t, self.policy, self.spec.policy_path, self.journal, self.say, self.spec.project)
        self.stop_at_checkpoint = False
        self.hangs = len(list(self.run_dir.glob("hang-*.txt")))  # numbers the hang-N.txt stack reports
        self.watcher = FileWatcher(lambda path, kind: self.events.put(("file_changed", (path, kind))),
                                   self.policy.debounce_s)
        self.live.watch(self.watcher)
        self.watcher.start()
        attempt = first
        while True:
            if self.stop_signal is not None:  # asked to stop between two attempts
                return self._end(self._stopped_by_signal())
            resume = self.points.newest(self.nan_abs_step, t.total_steps)
            result, launch = self._launch(attempt, self.plan, resume)
            if result is None:
                return self._end(launch)  # could not start at all
            outcome = self._outcome(attempt, result, resume)
            self._transition(RunState.STOPPING)
            if result.stopped_for_change and outcome.stop_signal is None:
                if self.live.project_next is not None:
                    return self._hand_over()
                # Stopped on purpose at a checkpoint to apply an edit: relaunch at once, no budget spent.
                self._transition(RunState.STARTING)
                attempt += 1
                continue
            decision = decide(self.history, outcome, self.policy, self.clock(),
                              functools.partial(rung_applies, t, self.plan, evidence=outcome.evidence),
                              stops_at_once(self.rules), t.ladder)
            record(self.history, outcome, decision, self.clock())
            for index, rung in decision.skipped:
                self.journal.event("remedy_skipped", **{"class": outcome.fault}, rung=index,
                                   actions=rung.describe(), trainer=t.family,
                                   reason=rung.unfit_reason(outcome.evidence) or "means nothing for this command")
            if decision.kind != "restart":
                return self._end(decision, attempt)
            self._transition(RunState.REMEDYING)
            remedied = self.remedier.apply(self.plan, decision, outcome, self.policy, attempt)
            if remedied.stop is not None:
                return self._end(remedied.stop)
            self.plan, self.wait_foreign = remedied.plan, remedied.wait_foreign
            self._transition(RunState.BACKOFF)
            if self._backoff(decision.delay_s):
                return self._end(self._stopped_by_signal())
            self._transition(RunState.STARTING)
            attempt += 1

    # --- one launch ------------------------------------------------------------------------------
    def _launch(self, attempt: int, plan: Plan,
                resume: StateRecord | None) -> tuple[AttemptResult | None, Decision]:
        t = self.trainer
        wait_foreign, self.wait_foreign = self.wait_foreign, False
        if self.gpu.before_launch(attempt, wait_foreign=wait_foreign):
            return None, self._stopped_by_signal()
        launch = plan.copy()
        try:
            self.live.before_launch(attempt)
            argv = t.launch(launch, attempt, resume, self.run_dir)
        except OSError as exc:
            # Never launch without the frozen copies; nothing of the user's has been touched.
            fault = "disk_full" if exc.errno == errno.ENOSPC else "config_error"
            return None, Decision("stop", EXIT_STOPPED, f"{fault}: cannot write this launch's files in "
                                  f"{self.run_dir}: {exc.strerror or exc}")
        resume_step = resume.step if resume else 0
        self.attempt_no, self.resume_step = attempt, resume_step
        self.oom_kills_at_launch = oom_kills()
        env = {k: v for k, v in {**CHILD_ENV_DEFAULTS, **self.spec.env, **launch.env}.items()  # the user's win
               if k not in SUPERVISOR_ONLY_ENV}
        self.journal.event("attempt_start", attempt=attempt, argv=argv,
                           resume_from=resume.dir if resume else None, resume_step=resume_step,
                           env=launch.env)
        self.say(f"attempt {attempt} starts from step {resume_step} ({shown_path(resume.dir)})" if resume else
                 f"attempt {attempt} starts from the beginning")
        self._status(state="running", attempt=attempt, step=resume_step,
                     total=t.total_steps, run_dir=str(self.run_dir))
        self._transition(RunState.RUNNING)
        hooks = AttemptHooks(self._on_state_done, self._on_progress, self._on_evidence, self._on_summary,
                             self._on_file_changed,
                             lambda fault: fault in self._live, self.points.final_written, self._on_hang,
                             lambda samples: self._status(gpu=self.gpu.status_entries(samples)), self._tick)
        try:
            result = run_attempt(argv, env, self.spec.cwd, self.run_dir / f"attempt-{attempt}.log",
                                 FaultScanner(self.rules), self.events, hooks, self.policy.stop_grace_s,
                                 self.policy.pump_wait_s, self.spec.echo, self._spawn, self.clock, self.policy.hang,
                                 t.output, t.planned_stop_signal)
        except process.LaunchError as exc:
            self._transition(RunState.STOPPING)
            return None, Decision("stop", EXIT_STOPPED, f"config_error: {exc}")
        return result, Decision("restart")

    def _outcome(self, attempt: int, r: AttemptResult, resume: StateRecord | None) -> Outcome:
        peaks = self.gpu.attempt_ended()
        forget_trainer(self.run_dir)
        self._on_summary(r.obs)
        self.points.collect()
        if r.fault == "fp8_serializer" and r.obs.saving_state_label is not None:
            self.points.mark_failed_save(r.obs.saving_state_label)
        # A state saved proves how far it got (the bar may lag; a step begun after the last one is void).
        bar = max(0, self._absolute(r.obs.progress.step) - self.resume_step) if r.obs.progress else 0
        trained = self.points.steps_proven() if r.completed else max(bar, self.points.steps_proven())
        self._status(step=self.resume_step + trained)  # progress snapshots are throttled
        self.nan_abs_step = None if r.nan_progress_step is None else self._absolute(r.nan_progress_step)
        if self.nan_abs_step is not None:
            self.points.mark_tainted(self.nan_abs_step)  # saved at or after the NaN: never a resume point
        ev = r.evidence
        self.journal.event("attempt_end", attempt=attempt, exit_code=r.exit_code, signal=r.signal,
                           child_status=r.obs.child_status, child_signal=r.obs.child_signal,
                           uptime_s=round(r.uptime_s, 3), steps_trained=trained,
                           step=self.resume_step + trained, skipped_lines=r.obs.skipped_lines, gpu=peaks,
                           planned_stop="run_complete" if r.completed else "relaunch" if r.stopped_for_change
                           else None)  # trainsup stopped it on purpose: its signal is no fault
        gpu_at_oom, foreign_mib = self.gpu.oom_details() if r.fault == "cuda_oom" else (None, 0)
        if r.fault is not None:
            self.journal.event("fault", **{"class": r.fault}, evidence=ev.line if ev else None,
                               line=ev.lineno if ev else None, attempt=attempt,
                               **({"gpu": gpu_at_oom} if gpu_at_oom is not None else {}))
            self.say(fault_sentence(attempt, r, ev, self.run_dir / f"attempt-{attempt}.log"))
            self._status(last_fault=r.fault, last_fault_evidence=ev.line.strip()[:400] if ev else None)
        same = r.fault == "host_oom_killed" and killed_for_memory(self.oom_kills_at_launch, oom_kills()) is False
        if same:  # killed, but not for memory: nothing to remedy
            self.journal.event("info", attempt=attempt, message=NOT_FOR_MEMORY)
            self.say(NOT_FOR_MEMORY)
        return Outcome(attempt, r.exit_code, r.signal, r.obs.child_status, r.obs.child_signal, r.uptime_s,
                       r.fault, ev.line if ev else None, ev.lineno if ev else None, trained,
                       self.points.steps_proven() > 0, self.clock(), r.stop_signal, foreign_mib, same)

    def _spawn(self, argv: list[str], env: dict[str, str], cwd: Path | None) -> process.Child:
        child = self.spawn(argv, env, cwd)
        self.child_pid = child.pid
        record_trainer(self.run_dir, child.pid, self.attempt_no)  # for the next supervisor, should we die
        self.gpu.attach(child, self.events)
        self.deadline.launched(self.trainer.planned_stop_signal)  # its stop may save a state
        self.notifier.ready()  # systemd: started once the first trainer is launched
        return child

    # --- live hooks ------------------------------------------------------------------------------
    def _on_progress(self, progress: Progress) -> None:
        now = self.clock()
        if not self.trainer.output.announces_states and now - self._states_looked >= STATES_INTERVAL_S:
            # No line says when a state is complete: look on disk as training goes on.
            self._states_looked = now
            self._on_state_done(None, None)
        if now - self._status_written < STATUS_INTERVAL_S and progress.step < progress.total:
            return  # a snapshot a few times a second is plenty; the bar may redraw far more often
        self._status_written = now
        loss = None if progress.loss is None or math.isnan(progress.loss) else progress.loss
        total = self.trainer.total_steps or progress.total
        step = min(self._absolute(progress.step), total or math.inf)  # stopped at the last, it may begin one more
        self._status(step=step, total=total, loss=loss, rate=progress.rate)
        if not self.spec.echo and now - self._progress_said >= QUIET_PROGRESS_S:  # --quiet: the bar is not shown
            self._progress_said = now
            self.say(progress_sentence(self.attempt_no, int(step), total, progress.loss, progress.rate))

    def _absolute(self, step: int) -> int:
        """The true step of a step the trainer printed (kohya counts from its resume point)."""
        return step if self.trainer.output.absolute_steps else self.resume_step + step

    def _on_evidence(self, evidence: Evidence) -> None:
        if evidence.fault in self._live:
            self.journal.event("fault_live", **{"class": evidence.fault}, evidence=evidence.line,
                               line=evidence.lineno, attempt=self.attempt_no)

    def _on_hang(self, pid: int, idle_s: float, clock: HangClock, obs: Observations) -> Evidence:
        self.hangs += 1
        step = None if clock.step is None else self._absolute(clock.step)
        return take_hang_stacks(self.hangs, pid, idle_s, clock, step, self.gpu.utilization(), self.run_dir,
                                self.journal, self.say, self.attempt_no, obs)

    def _on_summary(self, obs: Observations) -> None:
        """The trainer's start-up summary: the adapter fixes this attempt's step offset, and may warn."""
        record_trainer(self.run_dir, self.child_pid, self.attempt_no)  # the training child exists by now
        notice = self.trainer.on_summary(obs.batches_per_epoch, obs.grad_accum)
        if notice is not None:
            self.journal.event("warning", attempt=self.attempt_no, **notice.fields, message=notice.message)
            self.say(notice.console)

    def _on_state_done(self, path: str | None, obs: Observations | None) -> None:
        only = self.spec.cwd / path if path and (self.spec.cwd / path).is_dir() else None  # None: look at all
        if obs is not None:
            self._on_summary(obs)
        new = self.points.collect(only)
        self.deadline.on_states(new)
        if self.points.run_complete:
            self.events.put(("complete", None))
            return
        if self.points.relaunch_at_state:  # a planned relaunch (the adapter said why), as an edit's
            self.stop_at_checkpoint = False  # the relaunch applies scheduled edits too
            self.events.put(("stop_for_change", None))
            return
        if self.stop_at_checkpoint and new:
            self.stop_at_checkpoint = False
            self.say(f"step {new[-1].step} is saved ({shown_path(new[-1].dir)}): restarting from it to apply "
                     "the scheduled change")
            self.events.put(("stop_for_change", None))

    def _on_file_changed(self, change: tuple[Path, str]) -> None:
        action = self.live.on_change(*change, self.plan)  # the adapter updates the plan remedies read
        if action != "none":
            edited(self.run_dir, self.trainer)  # an input edited live is still this run
        if action in ("policy", "command"):
            self.policy = self.live.policy
            self.gpu.policy = self.policy.gpu
            self._compose_rules()
        if action == "now":
            self.events.put(("stop_for_change", None))
        self.stop_at_checkpoint = self.stop_at_checkpoint or action in ("at_checkpoint", "command")

    # --- waiting and ending ----------------------------------------------------------------------
    def _backoff(self, delay: float) -> bool:
        """Wait ``delay`` seconds; True when a stop signal arrived meanwhile."""
        deadline = self.clock() + delay
        while self.stop_signal is None:
            self._tick()
            left = deadline - self.clock()
            if left <= 0:
                return False
            try:
                kind, payload = self.events.get(timeout=min(left, 0.2))  # a stop request wakes us at once
            except queue.Empty:
                continue
            if kind == "file_changed":
                self._on_file_changed(payload)
        return True

    def _hand_over(self) -> int:  # the command was edited: the CLI execs a new supervisor (``reexec``)
        self.journal.event("supervisor_restart", reason="the project's command changed", attempt=self.attempt_no)
        self.say("the project's command changed: restarting trainsup on the edited file")
        self._close()
        # The lock stays held (never a moment without a supervisor), and the run dir stays this run's.
        self.reexec_env = {**self.owner.lock.hand_over(), HANDED_OVER_ENV: str(self.run_dir)}
        return 0

    def _stopped_by_signal(self) -> Decision:
        sig = self.stop_signal or signal.SIGTERM
        return Decision("signal", 128 + sig, f"stopped by {signal.Signals(sig).name}")

    def _end(self, decision: Decision, attempt: int | None = None) -> int:
        decision = self.deadline.conclude(decision, self.stop_signal, self.journal, self.points, self.say)
        code = decision.exit_code if decision.exit_code is not None else EXIT_STOPPED
        trained_with = trainedwith.conclude(self.run_dir, decision.kind, self.say)  # what remedies changed
        if decision.kind == "finish":
            final = self.points.publish_final()
            self.journal.event("finished", reason=decision.reason, final_weights=final, attempt=attempt,
                               trained_with=trained_with)
            self.state = RunState.FINISHED
            self.say(f"training finished: the final weights are {shown_path(final)}" if final else
                     "training finished (the trainer wrote no final weights trainsup knows of)")
        else:
            self.journal.event("gave_up", reason=decision.reason, exit_code=code, attempt=attempt,
                               trained_with=trained_with)
            self.state = RunState.GAVE_UP if decision.kind == "give_up" else RunState.STOPPED
            self.say(end_sentence(self.state.value, code, decision.reason))
        self._status(state=self.state.value, exit_code=code, reason=decision.reason)
        self.notifier.stopping(f"{self.state.value}: {decision.reason}")
        self._close()
        self.owner.lease.release()  # not at a hand-over: the same pid goes on holding the run
        return code

    def _close(self) -> None:
        for sensor in filter(None, (getattr(self, "watcher", None), getattr(self, "gpu", None))):
            sensor.stop()
        for listener in self.listeners:  # before the journal: a listener may journal while it drains
            listener.close()
        self.journal.close()
        self.notifier.close()

    def _tick(self) -> None:  # every pass of the decision loop: systemd's watchdog, the lease when due
        self.notifier.tick()
        self.owner.tick(self.say, self.request_stop)
        self.deadline.tick(self.journal, self.say, self.request_stop, self.stop_signal)

    def _transition(self, new: RunState) -> None:
        self.state = check_transition(self.state, new)
        self._status(state=new.value)

    def _status(self, **fields: Any) -> None:
        """status.json, and the same story in one line for systemd."""
        self.journal.status(**fields)
        self.notifier.status(status_line(self.journal.snapshot()))

    def say(self, message: str) -> None:
        CONSOLE.say(f"trainsup: {message}")  # on a line of its own, never on the trainer's

