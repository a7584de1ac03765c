"""Programs an adapter asks to run before its trainer (``Launch.before``: musubi-tuner's latent caching,
when a remedy or an accepted edit changed what its caches are made from), run by the real engine with
real processes: each to its end first, its output in its own log; one that fails stops the run with one
line and the trainer never starts; a stop request ends it at once."""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from trainsup.adapters.command import CommandRun
from trainsup.record.journal import read_events
from trainsup.run.decide import EXIT_STOPPED
from trainsup.run.engine import Supervisor
from trainsup.run.policy import parse_policy
from trainsup.run.spec import RunSpec
from trainsup.trainers.base import PreStep

POLICY = "backoff:\n  initial_s: 1.0\n  max_s: 2\nstop:\n  grace_s: 5\n"


def _with_before(monkeypatch: pytest.MonkeyPatch, *steps: PreStep) -> None:
    launch = CommandRun.launch

    def launch_with(self: CommandRun, *args: object, **kwargs: object) -> object:
        return dataclasses.replace(launch(self, *args, **kwargs), before=steps)  # type: ignore[arg-type]

    monkeypatch.setattr(CommandRun, "launch", launch_with)


def _supervisor(tmp: Path, trainer: str) -> tuple[Supervisor, Path]:
    run_dir = tmp / "run"
    spec = RunSpec((sys.executable, "-c", trainer), tmp, run_dir, {}, False, None)
    return Supervisor(spec, parse_policy(POLICY, "policy.yaml")), run_dir


def test_the_steps_run_first_in_order_and_the_trainer_after_them(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    made = tmp_path / "made.txt"
    _with_before(monkeypatch,
                 PreStep((sys.executable, "-c", f"open({str(made)!r}, 'w').write('latents\\n'); print('cached 4')"),
                         "caching the latents"),
                 PreStep((sys.executable, "-c", f"open({str(made)!r}, 'a').write('text\\n')"), "caching the text"))
    sup, run_dir = _supervisor(tmp_path, f"import sys; sys.exit(0 if open({str(made)!r}).read() == "
                                         "'latents\\ntext\\n' else 7)")
    assert sup.run() == 0
    events = read_events(run_dir)
    kinds = [e["event"] for e in events if e["event"] in ("attempt_start", "pre_step_start", "pre_step_end",
                                                           "attempt_end")]
    assert kinds == ["attempt_start", "pre_step_start", "pre_step_end", "pre_step_start", "pre_step_end",
                     "attempt_end"]
    assert [e["exit_code"] for e in events if e["event"] == "pre_step_end"] == [0, 0]
    assert (run_dir / "before" / "attempt-1.1.log").read_text() == "cached 4\n"
    assert not list(run_dir.glob("attempt-*.before*"))  # attempt-*.log counts attempts: never among them


def test_a_failed_step_stops_the_run_with_its_line_and_the_trainer_never_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trained = tmp_path / "trained"
    failing = "import sys; print('loading vae'); sys.exit('FileNotFoundError: vae.pth')"
    _with_before(monkeypatch, PreStep((sys.executable, "-c", failing), "caching the latents"))
    sup, run_dir = _supervisor(tmp_path, f"open({str(trained)!r}, 'w')")
    assert sup.run() == EXIT_STOPPED
    assert not trained.exists()
    (gave_up,) = [e for e in read_events(run_dir) if e["event"] == "gave_up"]
    assert "caching the latents failed (exit 1): FileNotFoundError: vae.pth" in gave_up["reason"]
    assert "the trainer was not launched" in gave_up["reason"]


def test_a_stop_request_ends_a_step_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trained = tmp_path / "trained"
    _with_before(monkeypatch, PreStep((sys.executable, "-c", "import time; time.sleep(60)"), "caching the latents"))
    sup, run_dir = _supervisor(tmp_path, f"open({str(trained)!r}, 'w')")
    timer = threading.Timer(1.5, sup.request_stop, (signal.SIGTERM,))
    timer.start()
    started = time.monotonic()
    code = sup.run()
    took = time.monotonic() - started
    timer.join()
    assert code != 0 and not trained.exists()
    assert took < 20, took  # the sleep was stopped, not waited for
    (end,) = [e for e in read_events(run_dir) if e["event"] == "pre_step_end"]
    assert end["signal"] == signal.SIGTERM or end["exit_code"] not in (0, None)
