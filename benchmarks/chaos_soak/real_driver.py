"""The real mode's run driver: `RealRun`, `ChaosRun`'s loop (start `trainsup run --quiet`, follow the
journal and the steps bar, arm and fire each injection, restart a killed supervisor) over the bed's
sd-scripts command, run from the bed's sd-scripts dir. What it changes: the plan (`plan_real_run`),
the faults (SIGKILL or SIGSTOP of train_network.py alone, found under trainsup by
`trainer_process`; SIGKILL of trainsup), the save moment (the current attempt's weights file of the
aimed-at step just appeared in the output dir), and its clean-up: every pid it froze is SIGKILLed in
a `finally`, and so is anything still running train_network.py on the run's output dir.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import psutil

from .driver import ChaosRun, Supervisor
from .files import read_ledger
from .params import REAL_EXTRA, REAL_POLICY, REAL_RUN_TIMEOUT_S, REAL_STEP_SECONDS
from .plan import Injection, plan_real_run
from .procwatch import ProcWatch
from .real_bed import Bed, bed_processes, is_trainer, trainer_process

STEP_WEIGHTS = re.compile(r"^(?P<name>.+)-step(?P<label>\d{8})\.safetensors$")


class RealRun(ChaosRun):
    timeout_s = REAL_RUN_TIMEOUT_S
    step_seconds = REAL_STEP_SECONDS
    end_invariant = 1
    proc_invariant = 5

    def __init__(self, index: int, seed: int, kinds: tuple[str, ...], work: Path, bed: Bed) -> None:
        super().__init__(index, seed, kinds, work, {}, None)
        self.bed = bed
        self.frozen: list[psutil.Process] = []  # every train_network.py this run SIGSTOPped

    @staticmethod
    def make_plan(seed: int, kinds: tuple[str, ...]) -> list[Injection]:
        return plan_real_run(seed, kinds)

    def prepare(self, tmpfs: bool = False) -> None:
        self.dir.mkdir(parents=True)
        self.policy.write_text(REAL_POLICY)

    def argv(self) -> list[str]:
        return self.bed.command(self.out, *REAL_EXTRA)  # the reference's command, on this run's output dir

    def launch_cwd(self) -> Path:
        return self.bed.sd_scripts

    def launch_env(self) -> dict[str, str]:
        return self.bed.env()

    def new_watch(self) -> ProcWatch:
        return ProcWatch(self.out, is_trainer)

    def run(self) -> None:
        try:
            super().run()
        finally:
            for proc in self.frozen:  # never leave a frozen 4 GB trainer behind
                try:
                    proc.kill()  # psutil refuses a pid reused by another process
                except psutil.Error:
                    pass
            for proc in bed_processes(self.out):  # an exception cut the loop short: what is left of it
                try:
                    proc.kill()
                except psutil.Error:
                    pass

    # --- moments and faults ------------------------------------------------------------------------
    def _due(self, inj: Injection, sup: Supervisor, step: int | None, n: int | None) -> bool:
        if inj.moment == "launch":
            return super()._due(inj, sup, step, n)
        if step is None or step < int(inj.at_step) or trainer_process(sup.proc.pid) is None:
            return False
        if inj.kind == "freeze" and not n:
            return False  # training, not loading: the 5 s training timeout is the one under test
        if inj.moment == "save":
            return self._save_begun(inj, sup)
        return True

    def _save_begun(self, inj: Injection, sup: Supervisor) -> bool:
        """The current attempt's weights file of the aimed-at step appeared since the injection was
        armed (kohya writes it first, then the state dir): the save is under way."""
        att = self.attempt(sup)
        if att is None or self.armed_at is None:
            return False
        name, offset = attempt_naming(att)
        try:
            entries = list(self.out.iterdir())
        except OSError:
            return False
        for path in entries:
            m = STEP_WEIGHTS.match(path.name)
            if m is None or m["name"] != name or int(m["label"]) + offset != int(inj.save):
                continue
            try:
                if path.stat().st_mtime >= self.armed_at - 0.01:
                    return True
            except OSError:
                continue
        return False

    def _fire(self, inj: Injection, sup: Supervisor, step: int | None, n: int | None) -> None:
        pids = self.trainer_pids(sup)
        if inj.kind in ("kill_trainer", "freeze"):
            trainer = trainer_process(sup.proc.pid)
            if trainer is None:
                inj.note = "no train_network.py left to signal"
            else:
                if inj.kind == "freeze":
                    self.frozen.append(trainer)  # recorded first: the finally in `run` kills it
                try:
                    trainer.send_signal(signal.SIGKILL if inj.kind == "kill_trainer" else signal.SIGSTOP)
                except psutil.Error:
                    inj.note = "train_network.py ended before the signal"
        inj.fired = self.last_fired = time.time()
        self._look(inj, sup, step)
        if inj.kind == "kill_supervisor":
            sup.trainers, sup.loading = pids, n is None
            sup.killed = inj.fired
            sup.proc.kill()
            sup.proc.wait()
            sup.rc, sup.ended = sup.proc.returncode, inj.fired

    def _look(self, inj: Injection, sup: Supervisor, step: int | None) -> None:
        """The step it hit, and the states trainsup's ledger held then (for the steps-redone figures)."""
        att = self.attempt(sup)
        inj.step = step if step is not None else int((att or {}).get("resume_step") or 0)
        ledger = read_ledger(self.run_dir)
        bad = set(ledger.get("bad_states", []))
        inj.complete = [s["dir"] for s in ledger.get("states", []) if s.get("dir") not in bad]


def attempt_naming(att: dict[str, Any]) -> tuple[str, int]:
    """(output name, label offset) of an attempt: kohya labels a resumed attempt's saves from 0 unless
    it skips to its initial step (exact.py in trainsup; here read off the attempt's own argv)."""
    argv = [str(a) for a in att.get("argv") or []]
    name = ""
    for i, arg in enumerate(argv):
        if arg == "--output_name" and i + 1 < len(argv):
            name = argv[i + 1]
        elif arg.startswith("--output_name="):
            name = arg.split("=", 1)[1]
    skips = "--skip_until_initial_step" in argv
    return name, 0 if skips else int(att.get("resume_step") or 0)
