"""The chaos soak's fixed shape: the fault kinds, the demo's size and pacing, the bounds the invariants
use, the file names it reads and writes, and the demo command line (with its environment) that both
the supervised runs and the reference runs launch."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

KINDS = ("kill_trainer", "kill_supervisor", "freeze", "disk_full", "edit")
RESTARTING = ("kill_trainer", "kill_supervisor", "freeze", "disk_full")
STEPS, SAVE_EVERY, SAMPLE_EVERY = 20, 4, 5
STEP_SECONDS, SAVE_SECONDS = 0.05, 0.3
ORPHAN_BOUND_S = 5.0  # docs/guides/robustness.md "When trainsup itself dies": the next output line, at most one step
TOLERANCE = 1e-4
RUN_TIMEOUT_S = 300.0
TMPFS_SIZE = "24m"
FILLER = "chaos-filler.bin"
# disk_full "journal": fire once the journal's last block has less room than this. The supervisor
# started again on the full disk journals more before its end (lease_taken_over, run_start, and so on:
# about 2-4 KiB), so one of its writes certainly meets the wall part-way (tmpfs counts whole pages).
JOURNAL_SLACK = 2048
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


# --- the real mode (`--real-kohya`): sd-scripts' train_network.py on the CPU bed (tests/real/bed.py) ---
REAL_KINDS = ("kill_trainer", "kill_supervisor", "freeze")
REAL_RUNS = 4  # ~1.5-2 min a run; one at a time (a trainer peaks at ~7 GB while it loads the model)
REAL_STEPS, REAL_SAVE_EVERY = 20, 5  # the bed's command; 8 optimizer steps an epoch on its dataset
REAL_STEP_SECONDS = 0.8
REAL_TOLERANCE = 1e-5
REAL_RUN_TIMEOUT_S = 900.0
# One data loader worker: sd-scripts' resume at an epoch's end is then exact (tests/real/test_real_exact_resume.py).
REAL_EXTRA = ("--max_data_loader_n_workers", "1")
# hang: 5 s while training (as in the demo mode); bounded start-up and save phases so that no frozen
# trainer stalls a run for the default 30 minutes; the stop grace of the real-trainer tests.
REAL_POLICY = ("backoff:\n  initial_s: 0.5\n  max_s: 1\nstop:\n  grace_s: 10\n"
               "hang:\n  min_timeout_s: 5\n  startup_timeout_s: 300\n  phase_timeout_s: 60\n")
REAL_INVARIANTS = {1: "finished", 2: "exact steps", 3: "names", 4: "weights", 5: "processes"}
