"""The beds, and the runs the suite's tests share: one run of each kind per bed (module scope), so a
real trainer runs each case once however many tests read it."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from typing import Any

import psutil
import pytest

from tests.behaviour.beds import BEDS, LONG, Bed
from tests.behaviour.harness import POLICY, Ctx, Run, digest_tree, supervise


@pytest.fixture(scope="module", params=BEDS, ids=[b.name for b in BEDS])
def bed(request: pytest.FixtureRequest) -> Bed:
    chosen: Bed = request.param
    why = chosen.prepare()
    if why is not None:
        pytest.skip(f"{chosen.name}: {why}")
    return chosen


def _run(bed: Bed, case: Any, factory: pytest.TempPathFactory, hook: Any = None, policy: str = POLICY,
         label: str | None = None) -> Run:
    tmp = factory.mktemp(f"{bed.name}-{label or case}")
    out = tmp / "out"
    return supervise(bed.launch(case, out, tmp), out, tmp, hook, policy=policy)


def kill_at_state_10(bed: Bed, cut: bool) -> Any:
    """A hook: when the journal says attempt 1 saved step 10, (cut that state, then) kill -9 the
    trainer, wait until it is gone, and keep a digest of the output dir as the kill left it."""

    def hook(event: dict[str, Any], ctx: Ctx) -> None:
        if event["event"] != "state_saved" or event["step"] != bed.at(10) or event["attempt"] != 1:
            return
        if "killed" in ctx.marks:
            return
        trainer = bed.trainer_process(ctx.pid)
        assert trainer is not None, f"{bed.name}: no trainer process under trainsup"
        if cut:
            bed.cut_state(bed.state_dir(ctx.out, bed.at(10)))
        trainer.kill()
        psutil.wait_procs([trainer], timeout=30)
        bed.settle(ctx.out)
        ctx.marks["killed"] = trainer.pid
        ctx.marks["digest"] = digest_tree(ctx.out)

    return hook


SEED = int(os.environ.get("TRAINSUP_KILL_SEED", "20"))


def kill_at_seeded_step(bed: Bed, where: str) -> Any:
    """A hook: once attempt 1 starts, watch it and kill -9 the trainer at a step drawn from
    ``TRAINSUP_KILL_SEED``: ``between saves``, once `trainsup status` shows a step after the state of
    step 10 and before the one of 15; ``inside a save``, the moment the state of step 10 or 15 appears
    on disk (its files are being written). Meanwhile every step the status shows is kept."""
    draw = random.Random(f"{SEED}-{bed.name}-{where}")
    step = bed.at(draw.choice([11, 12, 13, 14] if where == "between saves" else [10, 15]))

    def watch(ctx: Ctx) -> None:
        status = ctx.out / ".trainsup" / "status.json"
        seen: list[tuple[int, int]] = ctx.marks.setdefault("status_steps", [])
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and "done" not in ctx.marks:
            try:
                now = json.loads(status.read_text())
            except (OSError, ValueError):
                now = {}
            if now.get("state") == "running" and now.get("step") is not None:
                seen.append((int(now.get("attempt") or 0), int(now["step"])))
            if "killed" not in ctx.marks:
                due = (int(now.get("step") or 0) >= step if where == "between saves"
                       else bed.state_dir(ctx.out, step).exists())
                trainer = bed.trainer_process(ctx.pid) if due else None
                if trainer is not None:
                    trainer.kill()
                    ctx.marks["killed"] = trainer.pid
                    shown = now.get("step")
                    ctx.marks["kill"] = f"{where} at step {step} (seed {SEED}; status showed step {shown})"
            time.sleep(0.005)

    def hook(event: dict[str, Any], ctx: Ctx) -> None:
        if event["event"] == "attempt_start" and event["attempt"] == 1:
            threading.Thread(target=watch, args=(ctx,), daemon=True).start()
        elif event["event"] in ("finished", "gave_up"):
            ctx.marks["done"] = True

    return hook


def sigterm_at_state_5(event: dict[str, Any], ctx: Ctx, bed: Bed) -> None:
    """A hook: while the trainer trains (attempt 1 saved step 5), SIGTERM to trainsup; keep the
    trainer's process tree as it was then."""
    if event["event"] != "state_saved" or event["step"] != bed.at(5) or "tree" in ctx.marks:
        return
    ctx.marks["tree"] = psutil.Process(ctx.pid).children(recursive=True)
    ctx.marks["argvs"] = [p.cmdline() for p in ctx.marks["tree"]]
    os.kill(ctx.pid, signal.SIGTERM)


@pytest.fixture(scope="module")
def clean_run(bed: Bed, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _run(bed, "clean", tmp_path_factory)


@pytest.fixture(scope="module")
def killed_run(bed: Bed, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _run(bed, "kill", tmp_path_factory, kill_at_state_10(bed, cut=False))


@pytest.fixture(scope="module")
def cut_run(bed: Bed, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _run(bed, "cut", tmp_path_factory, kill_at_state_10(bed, cut=True))


def long_case(bed: Bed) -> None:
    """Skip, saying why, a case the bed leaves to the long command (``Bed.long_cases``)."""
    if bed.long_cases is not None and os.environ.get(LONG) != "1":
        pytest.skip(f"{bed.name}: {bed.long_cases}")


@pytest.fixture(scope="module")
def seeded_between_saves_run(bed: Bed, tmp_path_factory: pytest.TempPathFactory) -> Run:
    long_case(bed)
    return _run(bed, "kill", tmp_path_factory, kill_at_seeded_step(bed, "between saves"))


@pytest.fixture(scope="module")
def seeded_inside_a_save_run(bed: Bed, tmp_path_factory: pytest.TempPathFactory) -> Run:
    long_case(bed)
    return _run(bed, "kill", tmp_path_factory, kill_at_seeded_step(bed, "inside a save"))


@pytest.fixture(scope="module")
def remedy_run(bed: Bed, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _run(bed, "remedy", tmp_path_factory)


@pytest.fixture(scope="module")
def sigterm_run(bed: Bed, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _run(bed, "sigterm", tmp_path_factory, lambda event, ctx: sigterm_at_state_5(event, ctx, bed))


def kill_at_state_5(event: dict[str, Any], ctx: Ctx, bed: Bed) -> None:
    """A hook: kill -9 the trainer once attempt 1 saved step 5 (with no restart allowed: a give-up)."""
    if event["event"] != "state_saved" or event["step"] != bed.at(5) or "killed" in ctx.marks:
        return
    trainer = bed.trainer_process(ctx.pid)
    assert trainer is not None, f"{bed.name}: no trainer process under trainsup"
    trainer.kill()
    ctx.marks["killed"] = trainer.pid


@pytest.fixture(scope="module")
def gave_up_run(bed: Bed, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The trainer killed after its state of step 5 under a policy allowing no restart: trainsup gives up."""
    return _run(bed, "clean", tmp_path_factory, lambda event, ctx: kill_at_state_5(event, ctx, bed),
                POLICY + "restart:\n  max: 0\n", label="gave-up")
