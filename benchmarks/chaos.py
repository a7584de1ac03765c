"""Benchmark: a seeded chaos soak of `trainsup run` over the demo trainer (issue 12).

Each run trains the demo (20 steps, a state every 4, a sample every 5, 0.05 s of pacing a step, 0.3 s
a state save) under `trainsup run --quiet` and injects one to three faults at random moments, all
drawn from the run's own seed:

- `kill_trainer`: SIGKILL of the trainer's processes; some aimed inside a state save (a state dir
  seen without its last file: `TRAINSUP_DEMO_SAVE_SECONDS` paces the demo's saves), some at launch;
- `kill_supervisor`: SIGKILL of trainsup, then `trainsup run` again on the same command after a
  random delay (0-7 s: an orphan trainer has to die on its own, or be stopped by the successor);
- `freeze`: SIGSTOP of the trainer while it trains (policy `hang.min_timeout_s: 5`); trainsup finds
  the hang, stops the tree and resumes;
- `disk_full`: the output dir is a tmpfs of its own; a filler file leaves a few KiB free, mostly
  while a state is being saved; trainsup stops (`disk_full`, exit 4), the filler is deleted and
  `trainsup run` started again;
- `edit`: a caption of the run's own dataset copy or its prompt file rewritten mid-run.

After each run, violations of six invariants are counted:
1. finished runs end with the weights of an uninterrupted run (max abs diff <= 1e-4). The demo reads
   captions once at launch, so a caption edit reaches training only through a later launch: such a
   run is compared with a reference chained the same way (each segment of the run's resume lineage
   trained from the same step with the captions its attempt read);
2. no file of the output dir present before an injection changed or vanished, except a save in
   progress at that moment, the final-weights publish and the demo's append-only sample record;
   the dataset, prompt file and base model hold exactly what the benchmark wrote;
3. every resume (`attempt_start` with `resume_from`) came from a state that is complete (every file
   loads) and whose save no injection interrupted, and that the ledger lists and does not mark bad;
4. a killed supervisor's trainer died within 5 s (README: its next output line), unless it was a
   silent one the next supervisor stopped before launching (`orphan_stopped`); never two trainers
   on one output dir (process table sampled every 50 ms); none left after the last supervisor;
5. `events.jsonl` parses line by line and ends with `finished`; a `gave_up` only for the injected
   `disk_full`; each supervisor's exit code matches its journaled end;
6. no `Traceback (most recent call last)` in trainsup's stderr (with `--quiet` the trainer's output
   is not echoed there) and no internal-error exit 70.

    python benchmarks/chaos.py --runs 50 --seed 1 [--kinds kill_trainer,freeze] [--json] [--keep]
    python benchmarks/chaos.py --replay RUN_SEED [--kinds ...]     # one run, as printed

Exit 0 only with zero violations. `disk_full` needs `mount -t tmpfs` (root); refused, the kind is
skipped with a line on stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

KINDS = ("kill_trainer", "kill_supervisor", "freeze", "disk_full", "edit")
RESTARTING = ("kill_trainer", "kill_supervisor", "freeze", "disk_full")
STEPS, SAVE_EVERY, SAMPLE_EVERY = 20, 4, 5
STEP_SECONDS, SAVE_SECONDS = 0.05, 0.3
ORPHAN_BOUND_S = 5.0  # README "When trainsup itself dies": the next output line, at most one step
TOLERANCE = 1e-4
RUN_TIMEOUT_S = 300.0
TMPFS_SIZE = "24m"
FILLER = "chaos-filler.bin"
SAMPLE_RECORD = "sample/prompts_used.jsonl"
# What the demo writes into a state dir, last file last (demo/state.py). Kept here rather than
# imported from trainsup: the checker must not share the checked code's idea of "complete".
STATE_FILES = ("train_state.json", "model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl")
# hang: 5 s while training, as the issue asks; the start-up and save/sample phases get bounded
# timeouts too (a freeze can land in a sample or a save), so that no frozen trainer stalls a run for
# the default 30 minutes. A short grace: a stopped trainer never acts on SIGTERM, it waits for the KILL.
POLICY = ("backoff:\n  initial_s: 0.5\n  max_s: 2\nstop:\n  grace_s: 2\n"
          "hang:\n  min_timeout_s: 5\n  startup_timeout_s: 60\n  phase_timeout_s: 8\n")
BAR = re.compile(rb"steps: +(?:\d+%\|[^|\r\n]*\| )?(\d+)(?:/\d+ | ?it )")
WORDS = ("red", "blue", "square", "circle", "stripes", "dark", "bright", "small", "large", "pattern",
         "green", "a", "the", "on", "with", "grey", "tiny", "dot", "wave", "corner")
INVARIANTS = {1: "final weights", 2: "files kept", 3: "resume points", 4: "processes",
              5: "journal", 6: "tracebacks"}


# --- the plan of a run: everything drawn from its seed --------------------------------------------
@dataclass
class Injection:
    kind: str
    at_step: float  # absolute step at which it is armed; the fraction is a share of a step to wait
    moment: str  # "step" (while training), "save" (inside a state save) or "launch" (start-up)
    save: str = ""  # moment "save": the save aimed at ("8", ... or "last")
    delay: float = 0.0  # moment "launch": seconds after the attempt started
    restart_delay: float = 0.0  # kill_supervisor: seconds until trainsup is started again
    free_bytes: int = 0  # disk_full: bytes left free on the output dir's tmpfs
    target: str = ""  # edit: a caption file name, or "prompts"
    text: str = ""  # edit: the new content
    # filled in when it fires
    fired: float | None = None  # time.time()
    step: int | None = None  # absolute step the trainer had reached
    complete: list[str] = field(default_factory=list)  # complete state dirs on disk then
    incomplete: list[str] = field(default_factory=list)  # state dirs being written then
    snapshot: dict[str, str] = field(default_factory=dict)  # output dir: rel path -> sha256
    in_progress: set[str] = field(default_factory=set)  # rel paths of the snapshot still being written
    sample_record: bytes = b""  # the demo's append-only sample record then
    note: str = ""

    def describe(self) -> str:
        where = {"step": f"at step {self.at_step:.1f}", "launch": f"{self.delay:.1f} s into a launch",
                 "save": f"inside save {self.save}"}[self.moment]
        extra = {"kill_supervisor": f", restart after {self.restart_delay:.1f} s",
                 "disk_full": f", {self.free_bytes} bytes left", "edit": f", {self.target}"}.get(self.kind, "")
        return f"{self.kind} {where}{extra}"


def run_seeds(seed: int, runs: int, kinds: tuple[str, ...]) -> list[int]:
    """One seed per run; seed % len(kinds) picks a run's first kind, so every kind recurs."""
    rng = random.Random(seed)
    order = list(range(len(kinds)))
    rng.shuffle(order)
    seeds = []
    for i in range(runs):
        s = rng.randrange(1, 2**31)
        seeds.append(s - s % len(kinds) + order[i % len(kinds)])
    return seeds


def plan_run(seed: int, kinds: tuple[str, ...]) -> list[Injection]:
    rng = random.Random(seed)
    chosen = [kinds[seed % len(kinds)]]
    for _ in range(rng.choice((0, 0, 1, 1, 2))):
        kind = rng.choice(kinds)
        # one hang and one full disk a run: a second hang is stopped by design ("it hung again")
        if kind in ("freeze", "disk_full") and kind in chosen:
            continue
        chosen.append(kind)
    plan = [_injection(rng, kind) for kind in chosen]
    plan.sort(key=lambda inj: inj.at_step)
    return plan


def _injection(rng: random.Random, kind: str) -> Injection:
    moments = {"kill_trainer": (("save", 0.4), ("launch", 0.1)), "kill_supervisor": (("save", 0.2), ("launch", 0.2)),
               "disk_full": (("save", 0.7),)}.get(kind, ())
    draw, moment = rng.random(), "step"
    for name, share in moments:
        if draw < share:
            moment = name
            break
        draw -= share
    inj = Injection(kind, rng.uniform(1.0, STEPS - 0.5), moment)
    if moment == "save":
        inj.save = rng.choice([str(s) for s in range(SAVE_EVERY, STEPS + 1, SAVE_EVERY)] + ["last"])
        inj.at_step = (STEPS if inj.save == "last" else int(inj.save)) - 1.0
    elif moment == "launch":
        inj.delay = rng.uniform(0.1, 2.5)
    if kind == "kill_supervisor":
        inj.restart_delay = rng.uniform(0.0, 7.0)
    elif kind == "disk_full":
        inj.free_bytes = rng.randrange(0, 40_000)
    elif kind == "edit":
        if rng.random() < 0.5:
            inj.target = f"img{rng.randrange(8):02d}.txt"
            inj.text = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(2, 7))) + "\n"
        else:
            inj.target = "prompts"
            inj.text = f"{' '.join(rng.choice(WORDS) for _ in range(3))} --w 16 --h 16 --d {rng.randrange(99)} --s 2\n"
    return inj


# --- files ----------------------------------------------------------------------------------------
def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def digest_dir(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if rel.parts[0] in skip or not path.is_file():
            continue
        try:
            found[str(rel)] = sha256(path)
        except OSError:
            continue  # vanished while listed (a temp file of an atomic replace)
    return found


def state_dirs(out: Path) -> list[Path]:
    try:
        return sorted(p for p in out.iterdir() if p.name.endswith("-state") and p.is_dir())
    except OSError:
        return []


def has_all_files(state: Path) -> bool:
    return all((state / name).is_file() for name in STATE_FILES)


def state_problem(state: Path) -> str:
    """'' when every file of the state loads (torch for the .bin/.pkl, safetensors for the model)."""
    import torch
    from safetensors.numpy import load_file

    for name in STATE_FILES:
        path = state / name
        if not path.is_file():
            return f"{name} missing"
        try:
            if name.endswith(".json"):
                json.loads(path.read_text())
            elif name.endswith(".safetensors"):
                load_file(str(path))
            else:
                torch.load(path, map_location="cpu", weights_only=name != "random_states_0.pkl")
        except Exception as exc:  # noqa: BLE001 - any failure to load means the state is not whole
            return f"{name} does not load ({type(exc).__name__}: {str(exc)[:120]})"
    return ""


def in_progress(out: Path, rels: list[str]) -> set[str]:
    """Of these files, those a save was still writing: in a state dir without all its files, or a
    .safetensors whose header promises more bytes than the file holds."""
    from safetensors import safe_open

    busy = set()
    for rel in rels:
        path = out / rel
        if path.parent.name.endswith("-state") and not has_all_files(path.parent):
            busy.add(rel)
        elif rel.endswith(".safetensors"):
            try:
                with safe_open(str(path), framework="numpy") as fh:
                    fh.keys()
            except Exception:  # noqa: BLE001 - unreadable now: caught half-written
                busy.add(rel)
    return busy


def max_abs_diff(a: Path, b: Path) -> float:
    import numpy as np
    from safetensors.numpy import load_file

    wa, wb = load_file(str(a)), load_file(str(b))
    if sorted(wa) != sorted(wb):
        return float("inf")
    return max((float(np.max(np.abs(wa[k].astype(np.float64) - wb[k].astype(np.float64)))) for k in wa),
               default=0.0)


def read_events(run_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The journal's events, and the lines that do not parse."""
    try:
        text = (run_dir / "events.jsonl").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return [], []
    events, bad = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except ValueError:
            bad.append(line[:200])
    return events, bad


def demo_argv(assets: dict[str, Path], dataset: Path, prompts: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "trainsup.demo.train_network",
            "--pretrained_model_name_or_path", str(assets["model"]), "--train_data_dir", str(dataset),
            "--output_dir", str(out), "--output_name", "lora", "--max_train_steps", str(STEPS),
            "--save_every_n_steps", str(SAVE_EVERY), "--save_state", "--seed", "1234", "--train_batch_size", "2",
            "--learning_rate", "1e-3", "--sample_prompts", str(prompts), "--sample_every_n_steps",
            str(SAMPLE_EVERY), *extra]


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSUP_DEMO_") and k != "TRAINSUP_DEBUG"}
    env.update(extra)
    return env


# --- references: the weights of uninterrupted runs --------------------------------------------------
class References:
    """Plain demo runs (no trainsup, no pacing), cached by their caption schedule: a list of
    (start step, dataset dir) segments, each resumed from the previous segment's state."""

    def __init__(self, work: Path, assets: dict[str, Path]) -> None:
        self.work, self.assets = work, assets
        self.cache: dict[tuple[tuple[int, str], ...], Path] = {}
        self.runs = 0

    def weights(self, schedule: list[tuple[int, Path]]) -> Path:
        return self._out(schedule) / "lora.safetensors"

    def _out(self, schedule: list[tuple[int, Path]]) -> Path:
        key = tuple((step, str(dataset)) for step, dataset in schedule)
        if key in self.cache:
            return self.cache[key]
        extra: list[str] = []
        before = self._out(schedule[:-1]) if len(schedule) > 1 else None  # first: it names its own dir
        out = self.work / "refs" / f"ref{len(self.cache):03d}"
        if before is not None:
            start = schedule[-1][0]
            # kohya labels the saves after a resume from `prev` with step - prev (prev: whole epochs here)
            label = start - schedule[-2][0]
            extra = ["--resume", str(before / f"lora-step{label:08d}-state"), "--skip_until_initial_step",
                     "--initial_step", str(start)]
        argv = demo_argv(self.assets, schedule[-1][1], self.assets["prompts"], out, *extra)
        done = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=600, check=False)
        self.runs += 1
        if done.returncode != 0:
            raise RuntimeError(f"reference run failed ({done.returncode}): {done.stderr[-2000:]}")
        self.cache[key] = out
        return out


# --- the process table ----------------------------------------------------------------------------
@dataclass
class Seen:
    pid: int
    last_alive: float  # time.time() of the last sample that found it running
    gone: float | None = None  # of the first sample that did not


class ProcWatch(threading.Thread):
    """Samples the process table every 50 ms for trainers on one output dir."""

    def __init__(self, out: Path) -> None:
        super().__init__(name="chaos-procwatch", daemon=True)
        self.out = str(out)
        self.seen: dict[int, Seen] = {}
        self.overlaps: list[tuple[float, list[int]]] = []
        self.halt = threading.Event()

    def _trainers(self) -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            cmd = proc.info["cmdline"] or []
            # the trainer itself, not trainsup (whose argv holds the same command after `--`)
            if len(cmd) > 2 and cmd[1:3] == ["-m", "trainsup.demo.train_network"] \
                    and self.out in cmd and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        return found

    def sample(self) -> None:
        now = time.time()
        alive: dict[int, int] = {}
        for proc in self._trainers():
            try:
                alive[proc.pid] = proc.ppid()
            except psutil.Error:
                continue
        # DataLoader workers carry the trainer's argv: count only the top of each tree
        roots = [pid for pid, parent in alive.items() if parent not in alive]
        for pid in alive:
            s = self.seen.get(pid)
            if s is None or s.gone is not None:
                self.seen[pid] = Seen(pid, now)
            else:
                s.last_alive = now
        for s in self.seen.values():
            if s.gone is None and s.pid not in alive:
                s.gone = now
        if len(roots) > 1:
            self.overlaps.append((now, sorted(roots)))

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self.sample()
            except psutil.Error:
                pass
            self.halt.wait(0.05)

    def alive(self) -> list[int]:
        return [s.pid for s in self.seen.values() if s.gone is None]


# --- one run --------------------------------------------------------------------------------------
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
    def __init__(self, index: int, seed: int, kinds: tuple[str, ...], work: Path,
                 assets: dict[str, Path], refs: References) -> None:
        self.index, self.seed, self.assets, self.refs = index, seed, assets, refs
        self.plan = plan_run(seed, kinds)
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
        self.wait_attempt_after: float | None = None  # a restarting fault fired then: wait for a relaunch

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

    def start(self) -> Supervisor:
        n = len(self.sups) + 1
        err = self.dir / f"trainsup-{n}.err"
        with open(err, "wb") as fh, open(self.dir / f"trainsup-{n}.out", "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "trainsup.cli", "run", "--quiet", "--policy", str(self.policy), "--",
                 *self.argv()], cwd=self.dir, stdout=out, stderr=fh, start_new_session=True,
                env=child_env(TRAINSUP_DEMO_STEP_SECONDS=str(STEP_SECONDS),
                              TRAINSUP_DEMO_SAVE_SECONDS=str(SAVE_SECONDS)))
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
        self.watch = ProcWatch(self.out)
        self.watch.start()
        began = time.monotonic()
        self.pending = list(self.plan)
        sup: Supervisor | None = self.start()
        try:
            while time.monotonic() - began < RUN_TIMEOUT_S:
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
                self.violate(5, self.kinds, f"the run did not end within {RUN_TIMEOUT_S:g} s")
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
            self.violate(4, self.kinds, f"trainer pid {pid} still alive {ORPHAN_BOUND_S:g} s after the last "
                                        "supervisor ended")
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
            self.ready_at = time.time() + (inj.at_step % 1 * STEP_SECONDS if inj.moment == "step" else 0)
        if time.time() < self.ready_at:
            return sup
        self._fire(inj, sup, step, n)
        self.pending.pop(0)
        self.armed_at = None
        if inj.kind in RESTARTING and not inj.note:
            self.wait_attempt_after = inj.fired
        if inj.kind == "disk_full":
            self.disk_full = inj
        if inj.kind == "kill_supervisor":
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
            sup.trainers, sup.loading = pids, n is None
            sup.killed = time.time()
            sup.proc.kill()
            sup.proc.wait()
            sup.rc, sup.ended = sup.proc.returncode, time.time()
        elif inj.kind == "disk_full":
            if not self.mounted:
                inj.note = "no tmpfs: not injected"
                return
            st = os.statvfs(self.out)
            free = st.f_bavail * st.f_frsize
            with open(self.out / FILLER, "wb") as fh:
                try:
                    fh.write(b"\0" * max(free - inj.free_bytes, 0))
                except OSError:
                    pass  # the trainer took some meanwhile: full all the same
        elif inj.kind == "edit":
            path = self.prompts if inj.target == "prompts" else self.dataset / "1_demo" / inj.target
            path.write_text(inj.text, encoding="utf-8")
            self.edits.append((time.time(), path, inj.text))

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
        (self.out / FILLER).unlink(missing_ok=True)

    # --- checks ----------------------------------------------------------------------------------
    def check(self) -> None:
        events, bad = read_events(self.run_dir)
        self.events = events
        self._check_journal(events, bad)
        self._check_tracebacks()
        self._check_files()
        self._check_resumes(events)
        self._check_processes(events)
        self._check_weights(events)
        self.redone = self._redone()

    def _kind_at(self, when: float | None) -> str:
        """The kind of the last injection fired before ``when`` (the run's kinds without one)."""
        fired = [inj for inj in self.plan if inj.fired is not None and (when is None or inj.fired <= when)]
        return fired[-1].kind if fired else self.kinds

    def _check_journal(self, events: list[dict[str, Any]], bad: list[str]) -> None:
        for line in bad:
            self.violate(5, self.kinds, f"events.jsonl line does not parse: {line!r}")
        disk_fulls = sum(1 for inj in self.plan if inj.kind == "disk_full" and inj.fired and not inj.note)
        reported = None
        for e in events:
            if e.get("event") == "gave_up":
                reason = str(e.get("reason"))
                if reason.startswith("disk_full") and e.get("exit_code") == 4 and disk_fulls:
                    disk_fulls -= 1  # ours: the benchmark gives the space back and starts it again
                    continue
                reported = e
                self.violate(5, self._kind_at(e.get("ts")), f"gave_up: {reason} (exit {e.get('exit_code')})")
        last = events[-1] if events else None
        if not self.timed_out and (last is None or last.get("event") != "finished") and last is not reported:
            self.violate(5, self.kinds, f"the journal does not end with finished: {json.dumps(last)[:300]}")
        ends = [e for e in events if e.get("event") in ("finished", "gave_up")]
        for sup in self.sups:
            if sup.killed is not None or self.timed_out:
                continue
            mine = [e for e in ends if sup.started <= e.get("ts", 0) <= (sup.ended or time.time()) + 1]
            want = None if not mine else 0 if mine[-1]["event"] == "finished" else mine[-1].get("exit_code")
            if sup.rc != want:
                self.violate(5, self._kind_at(sup.ended), f"trainsup #{sup.n} exited {sup.rc}; its journaled "
                                                          f"end says {want}")

    def _check_tracebacks(self) -> None:
        for sup in self.sups:
            text = sup.err.read_text(errors="replace")
            if "Traceback (most recent call last)" in text or sup.rc == 70:
                at = text.find("Traceback")
                self.violate(6, self._kind_at(sup.ended), f"trainsup #{sup.n} (exit {sup.rc}) printed: "
                                                          f"{text[max(at, 0):][:600]!r}")

    def _check_files(self) -> None:
        now = digest_dir(self.out, (".trainsup", FILLER))
        events, _ = read_events(self.run_dir)
        published = {str(Path(e["dst"]).relative_to(self.out)) for e in events
                     if e.get("event") == "final_published" and str(e.get("dst", "")).startswith(str(self.out))}
        reported = set(published)  # one violation a file, at the first injection that saw it whole
        for inj in self.plan:
            if inj.fired is None:
                continue
            for rel, digest in inj.snapshot.items():
                if now.get(rel) == digest or rel in inj.in_progress or rel in reported:
                    continue
                if rel == SAMPLE_RECORD and rel in now:
                    continue  # the demo appends a record per sample: checked as a prefix below
                what = "vanished" if rel not in now else "changed"
                reported.add(rel)
                self.violate(2, inj.kind, f"{rel} {what} after {inj.describe()}")
            used = self.out / SAMPLE_RECORD
            if inj.sample_record and not (used.is_file() and used.read_bytes().startswith(inj.sample_record)):
                self.violate(2, inj.kind, f"{SAMPLE_RECORD} lost records written before {inj.describe()}")
        expected = dict(self.inputs_before)
        for _, path, text in self.edits:
            rel = "prompts.txt" if path == self.prompts else str(path.relative_to(self.dataset))
            expected[rel] = hashlib.sha256(text.encode()).hexdigest()
        inputs_now = {**digest_dir(self.dataset), "prompts.txt": sha256(self.prompts)}
        for rel in sorted(set(expected) | set(inputs_now)):
            if expected.get(rel) != inputs_now.get(rel):
                self.violate(2, self._kind_at(None), f"input {rel} differs from what the benchmark wrote")
        if sha256(self.assets["model"]) != self.model_digest:
            self.violate(2, self.kinds, "the base model changed")

    def _check_resumes(self, events: list[dict[str, Any]]) -> None:
        ledger = self._ledger()
        listed = {s["dir"] for s in ledger.get("states", [])}
        bad = set(ledger.get("bad_states", []))
        interrupted: dict[str, Injection] = {}
        for inj in self.plan:
            if inj.fired is not None and inj.kind in RESTARTING:
                for d in inj.incomplete:
                    if not has_all_files(Path(d)):
                        interrupted[d] = inj
        for e in events:
            src = e.get("resume_from") if e.get("event") == "attempt_start" else None
            if not src:
                continue
            kind = self._kind_at(e.get("ts"))
            if src in interrupted:
                self.violate(3, kind, f"attempt {e['attempt']} resumed from {Path(src).name}, whose save "
                                      f"{interrupted[src].describe()} interrupted")
            elif src not in listed or src in bad:
                self.violate(3, kind, f"attempt {e['attempt']} resumed from {Path(src).name}, which the ledger "
                                      f"{'marks bad' if src in bad else 'does not list'}")
            problem = state_problem(Path(src))
            if problem:
                self.violate(3, kind, f"attempt {e['attempt']} resumed from {Path(src).name}: {problem}")

    def _ledger(self) -> dict[str, Any]:
        try:
            data = json.loads((self.run_dir / "ledger.json").read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _check_processes(self, events: list[dict[str, Any]]) -> None:
        for when, pids in self.watch.overlaps:
            self.violate(4, self._kind_at(when), f"two trainers at once on the output dir: pids {pids}")
        stopped = {pid: e for e in events if e.get("event") == "orphan_stopped" for pid in e.get("pids", [])}
        mtimes = [p.stat().st_mtime for p in self.out.rglob("*")
                  if p.is_file() and p.relative_to(self.out).parts[0] not in (".trainsup", FILLER)]
        for sup in self.sups:
            if sup.killed is None:
                continue
            for pid in sup.trainers:
                seen = self.watch.seen.get(pid)
                if seen is None:
                    continue  # gone before the table saw it
                died = seen.gone if seen.gone is not None else time.time()
                lived = died - sup.killed
                if lived <= ORPHAN_BOUND_S:
                    continue
                later = [e for e in events if e.get("event") == "attempt_start" and e["ts"] > sup.killed]
                wrote = [m for m in mtimes if sup.killed + ORPHAN_BOUND_S < m < died]
                stopped_late = pid in stopped and (not later or died > later[0]["ts"] + 0.1)
                # README: a trainer that prints nothing (here: still loading, no bar yet) lives on until
                # the next supervisor stops it, or until its first line meets the closed pipe.
                if sup.loading and not wrote and not stopped_late:
                    continue
                why = ("it was training when its supervisor died" if not sup.loading else
                       "it wrote files after the bound" if wrote else "it was still alive at the next launch")
                self.violate(4, "kill_supervisor", f"trainer pid {pid} outlived its killed supervisor by "
                                                   f"{lived:.1f} s ({why})")

    def _check_weights(self, events: list[dict[str, Any]]) -> None:
        if self.timed_out or not events or events[-1].get("event") != "finished" or self.sups[-1].rc != 0:
            return
        final = self.out / "lora.safetensors"
        if not final.is_file():
            self.violate(1, self.kinds, "finished without final weights at the command's path")
            return
        schedule = self._schedule(events)
        if schedule is None:
            self.violate(1, self.kinds, "cannot trace the final attempt's resume lineage through the ledger")
            return
        diff = max_abs_diff(final, self.refs.weights(schedule))
        if diff > TOLERANCE:
            segs = ", ".join(f"from {s} with {d.name}" for s, d in schedule)
            self.violate(1, self.kinds, f"final weights differ from the reference ({segs}): max abs diff {diff:.3g}")

    def _schedule(self, events: list[dict[str, Any]]) -> list[tuple[int, Path]] | None:
        """(start step, dataset dir) per segment of the final attempt's lineage, equal captions merged."""
        starts = {e["attempt"]: e for e in events if e.get("event") == "attempt_start"}
        by_dir = {s["dir"]: s["attempt"] for s in self._ledger().get("states", [])}
        attempt = max(starts)
        lineage = []
        while True:
            start = starts.get(attempt)
            if start is None:
                return None
            lineage.append(start)
            src = start.get("resume_from")
            if not src:
                break
            if src not in by_dir:
                return None
            attempt = by_dir[src]
        schedule: list[tuple[int, Path]] = []
        for start in reversed(lineage):
            # the demo reads its captions at launch: the edits made before this attempt started
            caption_edits = [(t, p, s) for t, p, s in self.edits if p != self.prompts and t < start["ts"]]
            dataset = self._dataset_version(caption_edits)
            if not schedule or schedule[-1][1] != dataset:
                schedule.append((int(start.get("resume_step") or 0), dataset))
        return schedule

    def _dataset_version(self, edits: list[tuple[float, Path, str]]) -> Path:
        if not edits:
            return self.assets["dataset"]
        version = self.dir / f"dataset-v{len(edits)}"
        if not version.exists():
            shutil.copytree(self.assets["dataset"], version)
            for _, path, text in edits:
                (version / path.relative_to(self.dataset)).write_text(text, encoding="utf-8")
        return version

    # --- the figures -----------------------------------------------------------------------------
    def _redone(self) -> list[tuple[str, int, int]]:
        """(kind, steps trained again, steps since the newest complete state) per restarting fault."""
        events = self.events
        steps = {s["dir"]: s["step"] for s in self._ledger().get("states", [])}
        found = []
        for inj in self.plan:
            if inj.fired is None or inj.kind not in RESTARTING or inj.note or inj.step is None:
                continue
            later = [e for e in events if e.get("event") == "attempt_start" and e["ts"] > inj.fired]
            if not later:
                continue
            newest = max([steps[d] for d in inj.complete if d in steps] + [0])
            # an orphan may save past the step it was at when its supervisor died: nothing redone then
            redone = max(inj.step - int(later[0].get("resume_step") or 0), 0)
            found.append((inj.kind, redone, inj.step - newest))
        return found

    def cleanup(self, keep: bool) -> None:
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


# --- the report -----------------------------------------------------------------------------------
def report(runs: list[ChaosRun], kinds: tuple[str, ...], seed: int, total_s: float, skipped: list[str],
           refs: int) -> dict[str, Any]:
    rows: dict[str, dict[str, int]] = {}
    for kind in kinds:
        rows[kind] = {"runs": sum(1 for r in runs if any(i.kind == kind for i in r.plan)),
                      "injections": sum(1 for r in runs for i in r.plan if i.kind == kind and i.fired and not i.note),
                      "violations": 0, "steps_redone": 0, "steps_since_state": 0, "restarts": 0}
    several = 0
    for r in runs:
        for v in r.violations:
            if v.kind in rows:
                rows[v.kind]["violations"] += 1
            else:
                several += 1
        for kind, redone, since in r.redone:
            rows[kind]["steps_redone"] += redone
            rows[kind]["steps_since_state"] += since
            rows[kind]["restarts"] += 1
    violations = [v for r in runs for v in r.violations]
    by_invariant = {str(n): sum(1 for v in violations if v.invariant == n) for n in INVARIANTS}
    return {"seed": seed, "runs": len(runs), "injections": sum(row["injections"] for row in rows.values()),
            "violations": len(violations), "kinds": rows, "violations_several_kinds": several,
            "violations_by_invariant": by_invariant, "skipped_kinds": skipped, "reference_runs": refs,
            "total_s": round(total_s, 1), "run_seeds": [r.seed for r in runs],
            "violation_list": [v.__dict__ for v in violations]}


def print_table(summary: dict[str, Any]) -> None:
    print(f"\n{'fault kind':<16} {'runs':>5} {'injections':>11} {'violations':>11}  steps redone / since newest state")
    for kind, row in summary["kinds"].items():
        redo = (f"{row['steps_redone']} / {row['steps_since_state']} over {row['restarts']} restarts"
                if row["restarts"] else "-")
        print(f"{kind:<16} {row['runs']:>5} {row['injections']:>11} {row['violations']:>11}  {redo}")
    if summary["violations_several_kinds"]:
        print(f"{'(several kinds)':<16} {'':>5} {'':>11} {summary['violations_several_kinds']:>11}")
    print(f"{'total':<16} {summary['runs']:>5} {summary['injections']:>11} {summary['violations']:>11}")
    print("violations by invariant: " + ", ".join(
        f"{n} {INVARIANTS[int(n)]}: {c}" for n, c in summary["violations_by_invariant"].items()))
    for v in summary["violation_list"]:
        print(f"  VIOLATION seed {v['seed']} invariant {v['invariant']} ({v['kind']}): {v['detail']}")
    minutes, seconds = divmod(summary["total_s"], 60)
    print(f"total time {int(minutes)} min {seconds:.0f} s ({summary['reference_runs']} reference runs)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--replay", type=int, metavar="RUN_SEED", help="run only the run of this seed")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma list of {', '.join(KINDS)}")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object, last line")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (kept anyway on violations)")
    args = parser.parse_args()
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        parser.error(f"--kinds: unknown {unknown or 'empty'} (known: {', '.join(KINDS)})")
    from trainsup.demo.make_assets import make_assets

    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="trainsup-chaos-"))
    skipped: list[str] = []
    if "disk_full" in kinds:
        why = can_mount(work)
        if why:
            print(f"chaos: disk_full skipped: cannot mount a tmpfs ({why})", file=sys.stderr)
            kinds = tuple(k for k in kinds if k != "disk_full")
            skipped.append("disk_full")
            if not kinds:
                return 0
    assets = make_assets(work / "assets")
    refs = References(work, assets)
    seeds = [args.replay] if args.replay is not None else run_seeds(args.seed, args.runs, kinds)
    kinds_arg = "" if kinds == KINDS else f" --kinds {','.join(kinds)}"
    runs: list[ChaosRun] = []
    for index, run_seed in enumerate(seeds):
        run = ChaosRun(index, run_seed, kinds, work, assets, refs)
        runs.append(run)
        t0 = time.monotonic()
        print(f"run {index + 1}/{len(seeds)} seed {run_seed} (replay: python benchmarks/chaos.py --replay "
              f"{run_seed}{kinds_arg}): {'; '.join(i.describe() for i in run.plan)}", flush=True)
        try:
            run.prepare(tmpfs="disk_full" not in skipped)
            run.run()
            run.check()
        finally:
            run.cleanup(keep=bool(run.violations) or args.keep)
        fired = [i for i in run.plan if i.fired and not i.note]
        print(f"  {len(fired)} injected, {len(run.sups)} supervisor(s), exit {run.sups[-1].rc}, "
              f"{len(run.violations)} violation(s), {time.monotonic() - t0:.0f} s", flush=True)
        for v in run.violations:
            print(f"  VIOLATION invariant {v.invariant} ({v.kind}): {v.detail}", flush=True)
        for inj in run.plan:
            if inj.note:
                print(f"  note: {inj.describe()}: {inj.note}", flush=True)
    summary = report(runs, kinds, args.seed, time.monotonic() - began, skipped, refs.runs)
    print_table(summary)
    if summary["violations"] or args.keep:
        print(f"work dir kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(summary))
    return 0 if summary["violations"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
