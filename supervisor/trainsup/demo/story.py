"""Owns `trainsup demo`: supervised runs of the demo trainer hitting the four documented faults, and
the prompt edit that trainsup's prompt protection turns into a checkpoint restart instead of a crash.

Each scenario starts from a broken command line, runs it under `trainsup run` (a real subprocess),
follows the journal, and tells in a few lines what was detected (by class id), what was changed and
where training resumed. The serializer scenario needs safetensors 0.4.1 from the package registry
for a throw-away venv; without a registry it says so and is skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..record.journal import read_events
from .envs import old_safetensors_venv
from .make_assets import make_assets

POLICY = "backoff:\n  initial_s: 0.5\n  max_s: 2\nstop:\n  grace_s: 5\n"
EventHook = Callable[[dict[str, Any]], None]


def follow(proc: subprocess.Popen[Any], run_dir: Path, on_event: EventHook | None = None,
           timeout: float = 600, poll_s: float = 0.01) -> list[dict[str, Any]]:
    """Wait for a `trainsup run` subprocess, calling ``on_event`` for each journal event as it lands."""
    seen = 0
    deadline = time.monotonic() + timeout
    while True:
        done = proc.poll() is not None
        events = read_events(run_dir)
        if on_event is not None:
            for event in events[seen:]:
                on_event(event)
        seen = len(events)
        if done:
            return events
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise TimeoutError(f"trainsup run did not finish within {timeout:g} s")
        time.sleep(poll_s)


@dataclass
class Scenario:
    title: str
    script: str
    flags: list[str]
    env: dict[str, str] = field(default_factory=dict)
    model: str = "model"
    python: str = sys.executable
    hook: Callable[[Path], EventHook] | None = None  # given the scenario dir, returns an event hook
    policy: str = ""  # added to the demo policy


def _argv(s: Scenario, assets: dict[str, Path], out: Path) -> list[str]:
    return [s.python, "-m", f"trainsup.demo.{s.script}", "--pretrained_model_name_or_path", str(assets[s.model]),
            "--train_data_dir", str(assets["dataset"]), "--output_dir", str(out), "--output_name", "lora",
            "--max_train_steps", "20", "--save_every_n_steps", "4", "--save_state", "--seed", "42",
            "--train_batch_size", "2", "--learning_rate", "1e-3", *s.flags]


def _edit_prompts_after_first_state(prompts: Path, text: str) -> EventHook:
    edited: list[int] = []

    def hook(event: dict[str, Any]) -> None:
        if event["event"] == "state_saved" and not edited:
            prompts.write_text(text, encoding="utf-8")
            edited.append(event["step"])
            print("  (the prompt file was edited mid-run, after the first saved state)")
    return hook


def _old_safetensors_python(where: Path) -> str | None:
    try:
        return str(old_safetensors_venv(where / "venv-safetensors-0.4.1"))
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError):
        return None


def _scenarios(work: Path, assets: dict[str, Path]) -> list[Scenario]:
    prompts = work / "prompts.txt"
    shutil.copy(assets["prompts"], prompts)
    sampling = ["--sample_prompts", str(prompts), "--sample_every_n_steps", "10"]
    protected = work / "prompts-protected.txt"
    shutil.copy(assets["prompts"], protected)
    return [
        Scenario("an fp8 Flux checkpoint loaded without --fp8_base", "flux_train_network", [],
                 model="model_fp8"),
        Scenario("sampling with cached latents hits a cuda/cpu mismatch (simulated: no GPU here)",
                 "train_network", ["--cache_latents", *sampling],
                 env={"TRAINSUP_DEMO_SIMULATE": "device_mismatch"}),
        Scenario("the sample-prompt file is edited while text-encoder outputs are cached "
                 "(prompt protection off to show the recovery)",
                 "flux_train_network", ["--cache_text_encoder_outputs", *sampling],
                 env={"TRAINSUP_DEMO_STEP_SECONDS": "0.1"},
                 hook=lambda d: _edit_prompts_after_first_state(prompts, "a red fox in fresh snow --w 16 --h 16\n"),
                 policy="live:\n  snapshot_prompts: false\n"),
        Scenario("--fp8_base state saves with the trainer's safetensors 0.4.1", "flux_train_network",
                 ["--fp8_base", "--mixed_precision", "bf16"]),
        Scenario("the same prompt edit with prompt protection on (the default): no crash at all",
                 "flux_train_network", ["--cache_text_encoder_outputs", "--sample_prompts", str(protected),
                                        "--sample_every_n_steps", "10"],
                 env={"TRAINSUP_DEMO_STEP_SECONDS": "0.1"},
                 hook=lambda d: _edit_prompts_after_first_state(protected, "a red fox in fresh snow --w 16 --h 16\n")),
    ]


def _tell(events: list[dict[str, Any]], rc: int) -> None:
    for e in events:
        if e["event"] == "fault":
            print(f"  detected  {e['class']}: {str(e['evidence'])[:110]}")
        elif e["event"] == "remedy":
            print(f"  changed   {'; '.join(e['actions'])}")
        elif e["event"] == "environment_upgrade":
            print(f"  upgraded  {e['spec']} in {e['python']} (exit {e['exit_code']})")
        elif e["event"] == "change_scheduled":
            print(f"  scheduled {Path(e['path']).name} change: apply {e['apply']}")
        elif e["event"] == "change_applied":
            print(f"  applied   {Path(e['path']).name} change in attempt {e['attempt']}")
        elif e["event"] == "attempt_start" and e["attempt"] > 1:
            where = f"step {e['resume_step']} ({Path(e['resume_from']).name})" if e["resume_from"] else \
                "step 0 (no complete state yet)"
            print(f"  resumed   attempt {e['attempt']} from {where}")
    end = events[-1] if events else {}
    if rc == 0:
        print(f"  finished  exit 0, final weights {end.get('final_weights')}")
    else:
        print(f"  ended     exit {rc}: {end.get('reason')}")


MARKER = ".trainsup-demo"  # a directory holding it is a demo's: a later demo may replace its runs


def earlier_demo(base: Path) -> bool:
    """Whether ``base`` holds an earlier demo (its marker, or an older demo's assets and policies)."""
    return (base / MARKER).is_file() or ((base / "assets" / "model.safetensors").is_file()
                                         and (base / "policy1.yaml").is_file())


def keep_dir(base: Path) -> str | None:
    """Make ``base`` ready for the demo's files; why it cannot be used (a directory that is not empty
    and is no earlier demo's: the demo would write five runs and a venv among someone's files)."""
    if base.exists() and not base.is_dir():
        return f"--keep {base}: not a directory"
    if base.is_dir() and any(base.iterdir()):
        if not earlier_demo(base):
            return (f"--keep {base}: the directory is not empty and holds no earlier demo; give a new or empty "
                    "directory (the demo writes five runs and a venv there)")
        for old in [*base.glob("run[0-9]*"), *base.glob("policy[0-9]*.yaml")]:  # the earlier demo's runs
            if old.is_dir():
                shutil.rmtree(old)
            else:
                old.unlink()
    base.mkdir(parents=True, exist_ok=True)
    (base / MARKER).write_text("trainsup demo: the runs here are replaced by the next `trainsup demo --keep`\n",
                               encoding="utf-8")
    return None


def run_demo(keep: Path | None = None, verbose: bool = False) -> int:
    """Run every scenario; 0 when all finished, 3 when one did not, 2 when the demo's directory
    cannot be used, 130 when interrupted (each supervised run stops its trainer first)."""
    try:
        base = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="trainsup-demo-"))
        refused = keep_dir(base)
        if refused is not None:
            print(f"trainsup: error: demo: {refused}", file=sys.stderr)
            return 2
        print(f"trainsup demo: assets and runs in {base}")
        assets = make_assets(base / "assets")
        return _run_scenarios(base, assets, verbose)
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        print(f"trainsup: error: demo: cannot write{where}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trainsup: error: demo interrupted", file=sys.stderr)
        return 130


def _run_scenarios(base: Path, assets: dict[str, Path], verbose: bool) -> int:
    started = time.monotonic()
    scenarios = _scenarios(base, assets)
    failures = 0
    for i, s in enumerate(scenarios, 1):
        print(f"\n[{i}/{len(scenarios)}] {s.title}")
        if s.flags[:1] == ["--fp8_base"]:
            py = _old_safetensors_python(base)
            if py is None:
                print("  skipped: could not install safetensors==0.4.1 into a venv (no package registry?)")
                continue
            s.python = py
        out = base / f"run{i}"
        argv = _argv(s, assets, out)
        print("  command   " + " ".join(a if a.startswith("-") or "/" not in a else Path(a).name for a in argv[1:]))
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSUP_DEMO_")}
        env.update(s.env)
        policy = base / f"policy{i}.yaml"
        policy.write_text(POLICY + s.policy, encoding="utf-8")
        cmd = [sys.executable, "-m", "trainsup.cli", "run", "--policy", str(policy)]
        cmd += [] if verbose else ["--quiet"]
        proc = subprocess.Popen([*cmd, "--", *argv], env=env, stdout=None if verbose else subprocess.DEVNULL,
                                stderr=None if verbose else subprocess.DEVNULL)
        try:
            events = follow(proc, out / ".trainsup", s.hook(base) if s.hook else None)
        except KeyboardInterrupt:
            proc.wait()  # Ctrl-C reached the supervised run too: it stops its trainer's group first
            raise
        _tell(events, proc.returncode)
        failures += proc.returncode != 0
    print(f"\ntrainsup demo: {len(scenarios) - failures}/{len(scenarios)} runs finished in "
          f"{time.monotonic() - started:.0f} s; journals are in {base}/run*/.trainsup/events.jsonl")
    return 0 if failures == 0 else 3
