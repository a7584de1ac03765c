"""The supervised run driver: `ChaosRun` prepares a run's own dataset copy, prompt file and output
dir (a tmpfs of its own when the plan holds `disk_full`), starts `trainsup run --quiet` over the demo,
follows the journal and the trainer's progress bar, arms each planned injection and fires it when due
(SIGKILL, SIGSTOP, a full disk, an edit), restarts trainsup after a killed supervisor or a full disk,
and notes what the output dir held at each fault. It owns `Supervisor` (one `trainsup run`),
`Violation` (what the checks in `checks.py` record through `ChaosRun.violate`) and `can_mount`.
`real_driver.RealRun` reuses the loop over sd-scripts: it overrides the class attributes, the hooks
(`make_plan`, `launch_cwd`, `launch_env`, `new_watch`, `prepare`, `argv`) and `_due`/`_fire`/`_look`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from .files import digest_dir, has_all_files, in_progress, read_events, sha256, state_dirs
from .filler import TopUp, fill
from .params import (
    BAR,
    FILLER,
    JOURNAL_SLACK,
    ORPHAN_BOUND_S,
    POLICY,
    RESTARTING,
    RUN_TIMEOUT_S,
    SAMPLE_RECORD,
    SAVE_SECONDS,
    STEP_SECONDS,
    TMPFS_SIZE,
    child_env,
    demo_argv,
)
from .plan import Injection, plan_run
from .procwatch import ProcWatch
from .references import References


@dataclass
class Supervisor:
    n: int
    proc: subprocess.Popen[bytes]
    started: float
    err: Path
    killed: float | None = None
    rc: int | None = None
    ended: float | None = None
    trainers: list[int] = field(default_factory=list)  # its trainer pids when it was killed
    loading: bool = False  # killed while its trainer had printed no progress bar yet (start-up)


@dataclass
class Violation:
    seed: int
    invariant: int
    kind: str  # the injection it follows, or the run's kinds joined by '+'
    detail: str


class ChaosRun:
    # what a subclass for another trainer (real_driver.RealRun) changes
    timeout_s = RUN_TIMEOUT_S  # a run not over by then is stopped and counted
    step_seconds = STEP_SECONDS  # the fraction of a step moment's `at_step` waits that share of it
    end_invariant = 5  # the invariant a run that does not end violates
    proc_invariant = 4  # the invariant a trainer left after the last supervisor violates

    def __init__(self, index: int, seed: int, kinds: tuple[str, ...], work: Path,
                 assets: dict[str, Path], refs: References | None) -> None:
        self.index, self.seed, self.assets, self.refs = index, seed, assets, refs
        self.plan = self.make_plan(seed, kinds)
        self.dir = work / f"run{index:02d}-{seed}"
        self.dataset = self.dir / "dataset"
        self.prompts = self.dir / "prompts.txt"
        self.out = self.dir / "out"
        self.run_dir = self.out / ".trainsup"
        self.policy = self.dir / "policy.yaml"
        self.sups: list[Supervisor] = []
        self.violations: list[Violation] = []
        self.edits: list[tuple[float, Path, str]] = []  # (time, file, content) in order
        self.inputs_before: dict[str, str] = {}  # dataset copy and prompt file: rel path -> sha256
        self.model_digest = ""
        self.mounted = False
        self.events: list[dict[str, Any]] = []
        self.timed_out = False
        self.last_fired = 0.0  # time.time() of the last injection
        self.bar_step: int | None = None  # the last absolute step the current attempt's bar showed
        self.redone: list[tuple[str, int, int]] = []  # (kind, steps redone, steps since state)
        # the injection loop's state
        self.pending: list[Injection] = []
        self.armed_at: float | None = None  # when the next injection was armed
        self.ready_at: float | None = None  # when it fires, once due
        self.pre_incomplete: set[str] = set()  # state dirs incomplete when it was armed
        self.restart_at: float | None = None  # time.monotonic() to start trainsup again
        self.disk_full: Injection | None = None  # fired; its space not given back yet
        self.topup: TopUp | None = None  # keeps the disk full meanwhile (disk_full "journal")
        self.wait_attempt_after: float | None = None  # a restarting fault fired then: wait for a relaunch

    @staticmethod
    def make_plan(seed: int, kinds: tuple[str, ...]) -> list[Injection]:
        return plan_run(seed, kinds)

    @property
    def kinds(self) -> str:
        return "+".join(sorted({inj.kind for inj in self.plan}))

    def violate(self, invariant: int, kind: str, detail: str) -> None:
        self.violations.append(Violation(self.seed, invariant, kind, detail))

    # --- set-up and supervisors ------------------------------------------------------------------
    def prepare(self, tmpfs: bool) -> None:
        self.dir.mkdir(parents=True)
        shutil.copytree(self.assets["dataset"], self.dataset)
        shutil.copy2(self.assets["prompts"], self.prompts)
        self.policy.write_text(POLICY)
        self.out.mkdir()
        if tmpfs and any(inj.kind == "disk_full" for inj in self.plan):
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(self.out)],
                           check=True, capture_output=True)
            self.mounted = True
        self.inputs_before = {**digest_dir(self.dataset), "prompts.txt": sha256(self.prompts)}
        self.model_digest = sha256(self.assets["model"])

    def argv(self) -> list[str]:
        return demo_argv(self.assets, self.dataset, self.prompts, self.out)

    def launch_cwd(self) -> Path:
        return self.dir

    def launch_env(self) -> dict[str, str]:
        return child_env(TRAINSUP_DEMO_STEP_SECONDS=str(STEP_SECONDS), TRAINSUP_DEMO_SAVE_SECONDS=str(SAVE_SECONDS))

    def new_watch(self) -> ProcWatch:
        return ProcWatch(self.out)

    def start(self) -> Supervisor:
        n = len(self.sups) + 1
        err = self.dir / f"trainsup-{n}.err"
        with open(err, "wb") as fh, open(self.dir / f"trainsup-{n}.out", "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "trainsup.cli", "run", "--quiet", "--policy", str(self.policy), "--",
                 *self.argv()], cwd=self.launch_cwd(), stdout=out, stderr=fh, start_new_session=True,
                env=self.launch_env())
        sup = Supervisor(n, proc, time.time(), err)
        self.sups.append(sup)
        return sup

    def trainer_pids(self, sup: Supervisor) -> list[int]:
        try:
            return [p.pid for p in psutil.Process(sup.proc.pid).children(recursive=True)]
        except psutil.Error:
            return []

    def attempt(self, sup: Supervisor) -> dict[str, Any] | None:
        """The attempt the supervisor last launched (its journal events are newer than its start)."""
        starts = [e for e in self.events if e.get("event") == "attempt_start" and e.get("ts", 0) >= sup.started]
        return starts[-1] if starts else None

    def step(self, sup: Supervisor) -> tuple[int | None, int | None]:
        """(absolute step, steps of this attempt) as the current attempt's bar last showed them."""
        att = self.attempt(sup)
        if att is None:
            return None, None
        try:
            with open(self.run_dir / f"attempt-{att['attempt']}.log", "rb") as fh:
                fh.seek(max(0, fh.seek(0, os.SEEK_END) - 4096))
                tail = fh.read()
        except OSError:
            return None, None
        bars = BAR.findall(tail)
        if not bars:
            return None, None
        n = int(bars[-1])
        return int(att.get("resume_step") or 0) + n, n

    # --- the loop --------------------------------------------------------------------------------
    def run(self) -> None:
        self.watch = self.new_watch()
        self.watch.start()
        began = time.monotonic()
        self.pending = list(self.plan)
        sup: Supervisor | None = self.start()
        try:
            while time.monotonic() - began < self.timeout_s:
                time.sleep(0.02)
                self.events, _ = read_events(self.run_dir)
                if sup is not None and sup.proc.poll() is not None:
                    if not self._goes_on(sup):
                        break
                    sup = None
                if sup is None:
                    if self.restart_at is not None and time.monotonic() >= self.restart_at:
                        sup, self.restart_at = self.start(), None
                    continue
                step, n = self.step(sup)
                self.bar_step = step if step is not None else self.bar_step
                if self.pending and self._relaunched(sup):
                    sup = self._inject(sup, step, n)
            else:
                self.timed_out = True
                self.violate(self.end_invariant, self.kinds, f"the run did not end within {self.timeout_s:g} s")
        finally:
            for s in self.sups:
                if s.proc.poll() is None:
                    s.proc.kill()
                    s.proc.wait()
                    s.rc, s.ended = s.proc.returncode, time.time()
        # the last supervisor's trainer must go with it (invariant 4 bounds it the same way)
        deadline = time.time() + ORPHAN_BOUND_S + 0.5
        while self.watch.alive() and time.time() < deadline:
            time.sleep(0.05)
        self.watch.halt.set()
        self.watch.join()
        for pid in self.watch.alive():
            self.violate(self.proc_invariant, self.kinds, f"trainer pid {pid} still alive {ORPHAN_BOUND_S:g} s "
                                                          "after the last supervisor ended")
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for inj in self.pending:
            inj.note = "not fired: the run ended first"

    def _goes_on(self, sup: Supervisor) -> bool:
        """A supervisor exited: whether the run goes on (we killed it, or it stopped on our full disk)."""
        if sup.killed is not None:
            return True  # its restart is scheduled already
        sup.rc, sup.ended = sup.proc.returncode, time.time()
        if sup.rc == 4 and self.disk_full is not None:
            self._after_disk_full(self.disk_full)
            self.disk_full, self.restart_at = None, time.monotonic()
            return True
        if self.disk_full is not None:
            self.disk_full.note = "not taken: the run ended before the disk was full"
        return False

    def _relaunched(self, sup: Supervisor) -> bool:
        """After a restarting fault, the next injection waits for the relaunch it causes."""
        if self.wait_attempt_after is None:
            return True
        att = self.attempt(sup)
        if att is None or att["ts"] <= self.wait_attempt_after:
            return False
        self.wait_attempt_after = None
        return True

    def _inject(self, sup: Supervisor, step: int | None, n: int | None) -> Supervisor | None:
        """Arm the next injection, fire it when due; returns the supervisor, or None once killed."""
        inj = self.pending[0]
        if self.armed_at is None:
            self.armed_at, self.ready_at = time.time(), None
            self.pre_incomplete = {str(p) for p in state_dirs(self.out) if not has_all_files(p)}
        if not self._due(inj, sup, step, n):
            return sup
        if self.ready_at is None:
            # a step moment waits its fraction of a step; the other moments fire at once
            self.ready_at = time.time() + (inj.at_step % 1 * self.step_seconds if inj.moment == "step" else 0)
        if time.time() < self.ready_at:
            return sup
        self._fire(inj, sup, step, n)
        self.pending.pop(0)
        self.armed_at = None
        if inj.kind in RESTARTING and not inj.note:
            self.wait_attempt_after = inj.fired
        if inj.kind == "disk_full":
            self.disk_full = inj
        if inj.kind == "kill_supervisor" or (inj.moment == "journal" and sup.killed is not None):
            self.restart_at = time.monotonic() + inj.restart_delay
            return None
        return sup

    def _due(self, inj: Injection, sup: Supervisor, step: int | None, n: int | None) -> bool:
        if inj.moment == "launch":
            # the first launch after the previous injection (after a restarting fault: its relaunch)
            att = self.attempt(sup)
            return att is not None and att["ts"] >= self.last_fired and time.time() >= att["ts"] + inj.delay \
                and bool(self.trainer_pids(sup))
        if step is None or step < int(inj.at_step):
            return False
        if inj.kind == "freeze" and not n:
            return False  # training, not loading: the 5 s training timeout is the one under test
        if inj.moment == "journal":
            slack = self.journal_slack()
            return slack is not None and slack < JOURNAL_SLACK
        if inj.moment == "save":
            for path in state_dirs(self.out):
                if str(path) in self.pre_incomplete or has_all_files(path):
                    continue
                if inj.save == "last" and "-step" in path.name:
                    continue
                return True
            return False
        return True

    # --- injecting -------------------------------------------------------------------------------
    def _fire(self, inj: Injection, sup: Supervisor, step: int | None, n: int | None) -> None:
        pids = self.trainer_pids(sup)
        if inj.kind in ("kill_trainer", "freeze"):
            # Signal first, then look: a killed or stopped trainer writes nothing more, so the
            # snapshot is what the files were at the fault, and a save in progress is hit mid-way.
            self._signal(pids, signal.SIGKILL if inj.kind == "kill_trainer" else signal.SIGSTOP)
        inj.fired = self.last_fired = time.time()
        self._look(inj, sup, step)
        if inj.kind == "kill_supervisor":
            self._kill(sup, pids, n)
        elif inj.kind == "disk_full":
            if not self.mounted:
                inj.note = "no tmpfs: not injected"
                return
            fill(self.out, self.out / FILLER, inj.free_bytes)
            if inj.moment == "journal":
                # The next supervisor starts on a disk kept full (what its takeover frees is taken
                # again): its records overflow the journal's last block (a write cut part-way), and
                # its end has only the reserve the killed one left.
                inj.journal_slack = self.journal_slack()
                self.topup = TopUp(self.out / FILLER)
                self.topup.start()
                self._kill(sup, pids, n)
        elif inj.kind == "edit":
            path = self.prompts if inj.target == "prompts" else self.dataset / "1_demo" / inj.target
            path.write_text(inj.text, encoding="utf-8")
            self.edits.append((time.time(), path, inj.text))

    @staticmethod
    def _kill(sup: Supervisor, pids: list[int], n: int | None) -> None:
        sup.trainers, sup.loading = pids, n is None
        sup.killed = time.time()
        sup.proc.kill()
        sup.proc.wait()
        sup.rc, sup.ended = sup.proc.returncode, time.time()

    def journal_slack(self) -> int | None:
        """Bytes left in the journal's last block (a write past them needs a free block)."""
        try:
            size = (self.run_dir / "events.jsonl").stat().st_size
            block = os.statvfs(self.out).f_bsize
        except OSError:
            return None
        return -size % block

    def _look(self, inj: Injection, sup: Supervisor, step: int | None) -> None:
        """The output dir as the injection found it."""
        inj.snapshot = digest_dir(self.out, (".trainsup", FILLER))
        inj.in_progress = in_progress(self.out, list(inj.snapshot))
        try:
            inj.sample_record = (self.out / SAMPLE_RECORD).read_bytes()
        except OSError:
            inj.sample_record = b""
        dirs = state_dirs(self.out)
        inj.complete = [str(p) for p in dirs if has_all_files(p)]
        inj.incomplete = [str(p) for p in dirs if not has_all_files(p)]
        att = self.attempt(sup)
        inj.step = step if step is not None else int((att or {}).get("resume_step") or 0)

    @staticmethod
    def _signal(pids: list[int], sig: int) -> None:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def _after_disk_full(self, inj: Injection) -> None:
        """trainsup stopped on the full disk: note the failed save, then give the space back.

        The fault bites at the first write that finds no space, after the fill: its step and the
        newest complete state are taken now (the attempt's end as journaled, else the bar's last step
        the log on the full disk could still take)."""
        dirs = state_dirs(self.out)
        inj.incomplete = sorted(set(inj.incomplete) | {str(p) for p in dirs if not has_all_files(p)})
        inj.complete = [str(p) for p in dirs if has_all_files(p)]
        ends = [int(e.get("step") or 0) for e in read_events(self.run_dir)[0]
                if e.get("event") == "attempt_end" and e.get("ts", 0) > (inj.fired or 0)]
        inj.step = max([inj.step or 0, self.bar_step or 0, *ends])
        self._stop_topup()
        (self.out / FILLER).unlink(missing_ok=True)

    def _stop_topup(self) -> None:
        if self.topup is not None:
            self.topup.stop()
            self.topup = None

    def cleanup(self, keep: bool) -> None:
        self._stop_topup()
        if self.mounted:
            if keep:
                shutil.copytree(self.out, self.dir / "out-kept", ignore=shutil.ignore_patterns(FILLER))
            subprocess.run(["umount", str(self.out)], check=False, capture_output=True)
            self.mounted = False


def can_mount(work: Path) -> str:
    """'' when a tmpfs can be mounted here, else why not."""
    probe = work / "mount-probe"
    probe.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)],
                              capture_output=True, text=True, check=False)
    except OSError as exc:
        return str(exc)
    if done.returncode != 0:
        return done.stderr.strip() or f"mount exited {done.returncode}"
    subprocess.run(["umount", str(probe)], check=False, capture_output=True)
    return ""
