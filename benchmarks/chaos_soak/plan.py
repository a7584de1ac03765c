"""The plan of a run, everything drawn from its seed: the per-run seeds of a soak (`run_seeds`), the
injections of one demo run (`plan_run`) or of one real-trainer run (`plan_real_run`), and
`Injection`, which also holds what the run driver found when it fired."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from .params import REAL_SAVE_EVERY, REAL_STEPS, SAVE_EVERY, STEPS, WORDS


@dataclass
class Injection:
    kind: str
    at_step: float  # absolute step at which it is armed; the fraction is a share of a step to wait
    moment: str  # "step" (while training), "save" (inside a state save), "launch" (start-up) or, for
    # disk_full, "journal" (the journal's last block nearly full; trainsup killed and started again on the full disk)
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
    journal_slack: int | None = None  # moment "journal": bytes left in the journal's last block then
    note: str = ""

    def describe(self) -> str:
        where = {"step": f"at step {self.at_step:.1f}", "launch": f"{self.delay:.1f} s into a launch",
                 "save": f"inside save {self.save}",
                 "journal": f"at step {self.at_step:.1f} under the journal "
                            "(trainsup killed, restarted on the full disk)"
                 }[self.moment]
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
               "disk_full": (("save", 0.7), ("journal", 0.15))}.get(kind, ())
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
        if moment == "journal":
            inj.free_bytes = 0  # not a byte: the journal has its last block's rest, and its reserve
    elif kind == "edit":
        if rng.random() < 0.5:
            inj.target = f"img{rng.randrange(8):02d}.txt"
            inj.text = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(2, 7))) + "\n"
        else:
            inj.target = "prompts"
            inj.text = f"{' '.join(rng.choice(WORDS) for _ in range(3))} --w 16 --h 16 --d {rng.randrange(99)} --s 2\n"
    return inj


def plan_real_run(seed: int, kinds: tuple[str, ...]) -> list[Injection]:
    """One or two injections over the real trainer (`REAL_KINDS`); at most one freeze a run."""
    rng = random.Random(seed)
    chosen = [kinds[seed % len(kinds)]]
    if rng.random() < 0.5:
        kind = rng.choice(kinds)
        if not (kind == "freeze" and kind in chosen):
            chosen.append(kind)
    plan = [_real_injection(rng, kind) for kind in chosen]
    plan.sort(key=lambda inj: inj.at_step)
    return plan


def _real_injection(rng: random.Random, kind: str) -> Injection:
    """`kill_trainer` between two saves or inside one (its weights file just appeared); `kill_supervisor`
    also at a launch (the trainer loading); `freeze` while training."""
    draw = rng.random()
    moment = "step"
    if kind == "kill_trainer" and draw < 0.5:
        moment = "save"
    elif kind == "kill_supervisor" and draw < 0.4:
        moment = "save" if draw < 0.2 else "launch"
    between = [s for s in range(1, REAL_STEPS) if s % REAL_SAVE_EVERY]  # steps that save nothing
    inj = Injection(kind, rng.choice(between) + rng.uniform(0.0, 0.9), moment)
    if moment == "save":
        inj.save = str(rng.choice(range(REAL_SAVE_EVERY, REAL_STEPS + 1, REAL_SAVE_EVERY)))
        inj.at_step = int(inj.save) - 1.0
    elif moment == "launch":
        inj.delay = rng.uniform(0.5, 12.0)  # the first launch after the injection before it
    if kind == "kill_supervisor":
        inj.restart_delay = rng.uniform(0.0, 7.0)
    return inj
