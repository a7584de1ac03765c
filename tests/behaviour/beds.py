"""The beds the behaviour suite runs on: one per trainer (and method) behind an adapter.

A bed knows its real trainer on this machine: whether it is here (``prepare`` builds it, or says why
not and the tests skip), the user's working command for each case (short runs: 20 steps, a state
every 5, or ``step_scale`` times those), how to find the trainer process under trainsup, where
attempt 1 keeps the state of step N and how a save cut half-way looks, whether the trainer can resume,
one remedy case (a command that fails on a fault trainsup fixes, and how to see that the next attempt
trained with the fix), and per-bed extra checks of the shared runs. A new adapter gets the whole suite
by adding a bed here.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
import tomllib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Literal

import numpy as np
import psutil
import yaml
from safetensors.numpy import load_file

from tests.behaviour.harness import Launch, Run
from tests.conftest import ROOT
from tests.conftest import diagnose_json as diagnose
from tests.e2e.demo_harness import clean_env
from tests.real import bed as realkohya
from tests.real.test_real_runs import BNB
from tests.real_diffusers import bed as realdiffusers
from tests.real_hf import bed as realhf
from tests.real_musubi import bed as realmusubi

Case = Literal["clean", "kill", "cut", "sigterm", "remedy"]
LONG = "TRAINSUP_LONG"  # =1: a bed's long cases too (see Bed.long_cases)


def children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def replaced(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag``'s value replaced."""
    at = argv.index(flag)
    return [*argv[: at + 1], value, *argv[at + 2:]]


def value_after(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


class Bed(ABC):
    name: str
    remedy_fault: str  # the fault class the remedy case's first attempt ends with

    def __init__(self) -> None:
        self._prepared: tuple[str | None] | None = None

    def prepare(self) -> str | None:
        """Build (or find built) the bed once; None when ready, else why it cannot run here."""
        if self._prepared is None:
            self._prepared = (self._prepare(),)
        return self._prepared[0]

    @abstractmethod
    def _prepare(self) -> str | None: ...

    @abstractmethod
    def launch(self, case: Case, out: Path, tmp: Path) -> Launch:
        """The user's command for this case (``remedy``: with what makes it fail), cwd and env."""

    @abstractmethod
    def trainer_process(self, trainsup_pid: int) -> psutil.Process | None:
        """The process that trains (the one a kill -9 takes down), under trainsup."""

    @abstractmethod
    def process_pattern(self, out: Path) -> re.Pattern[str]:
        """Matches the command line of every process of the trainer's tree for this out dir."""

    def settle(self, out: Path) -> None:
        """After the kill of ``trainer_process``: wait until what the trainer writes has stopped (a bed with
        more ranks: until the others, which trainsup stops, are gone too)."""

    @abstractmethod
    def state_dir(self, out: Path, step: int) -> Path:
        """Where attempt 1 keeps its state of step N."""

    @abstractmethod
    def state_weights(self, state: Path) -> Path:
        """The state's main weights file."""

    def resume_point(self, run: Run, newest: int) -> tuple[str, int]:
        """Where a resume goes when the newest complete state is of step ``newest``: that state."""
        return str(self.state_dir(run.out, newest)), newest

    # How far an interrupted run's weights may be from an uninterrupted run's: the residual the
    # docs (reference/adapters.md, measured.md) state for this adapter on this command (0: bit-exact).
    resume_tolerance = 0.0
    # Folders of the trainer's own logs: each launch starts a log of its own there (LitGPT's CSV
    # logger a new version_N), which trainsup leaves as the trainer writes them.
    log_dirs: tuple[str, ...] = ()
    # How many states more the attempts after a kill may write than the uninterrupted run writes
    # after the resume step (0: a resumed trainer saves where it would have).
    resumed_extra_states = 0

    # The suite's runs are 20 steps with a state every 5; a bed whose trainer steps too fast for a kill to land
    # between two states (two real ranks: ~27 steps a second) runs ``step_scale`` times as many, and every
    # step the suite names (the state of step 10, the last step) is that many times further on.
    step_scale = 1

    def at(self, step: int) -> int:
        """The bed's step for the suite's ``step`` (of 20)."""
        return step * self.step_scale

    # Why the seeded kills (two more runs) are left to the long command, for a bed whose runs are
    # costly; None: they run in every session. They run anyway with TRAINSUP_LONG=1.
    long_cases: str | None = None

    def comparable(self, rel: str) -> str:
        """A file's path in the output dir as two runs are compared (what differs by design left out)."""
        return rel

    @abstractmethod
    def weights_files(self, out: Path) -> list[Path]:
        """Every weights file the output dir shows (states' and published ones)."""

    @abstractmethod
    def load_weights(self, path: Path) -> dict[str, np.ndarray]:
        """A weights file's tensors, by name."""

    def cut_state(self, state: Path) -> None:
        """Make ``state`` look like a save cut half-way: its weights file truncated to half."""
        weights = self.state_weights(state)
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])

    @abstractmethod
    def other_run(self, out: Path, tmp: Path) -> tuple[Launch, str | None]:
        """Another run in the same output dir (another output name and network size, where the trainer
        has them), and the name of its own run dir there; None when its saves would land on the first
        run's names (trainsup then refuses it)."""

    @abstractmethod
    def check_remedy(self, run: Run) -> None:
        """The next attempt's argv/derived config/env carries the fix, and the trainer trained with it."""

    # Extra checks of the shared runs, in the trainer's own terms.
    def check_clean(self, run: Run) -> None:
        return None

    def check_killed(self, run: Run) -> None:
        return None

    def check_cut(self, run: Run) -> None:
        return None


# --- sd-scripts ------------------------------------------------------------------------------------
BNB_WARNING = ROOT / "tests" / "real" / "bnb_warning"
CONFIG = "# speed\n[caching]\ncache_latents = true  # latents in memory\n"


class KohyaBed(Bed):
    """Real kohya-ss/sd-scripts ``train_network.py`` (SD1.5 LoRA on CPU) under ``accelerate launch``:
    resumes with ``--resume``; every run prints bitsandbytes' AVX512-BF16 warning first, as it does on
    the bed's machine (``tests/real/bnb_warning``)."""

    name = "sd-scripts"
    remedy_fault = "flag_conflict"

    def _prepare(self) -> str | None:
        found = realkohya.build_bed()
        if isinstance(found, str):
            return found
        self.tree = found
        return None

    def env(self) -> dict[str, str]:
        inherited = os.environ.get("PYTHONPATH")
        return self.tree.env(PYTHONPATH=os.pathsep.join(p for p in (str(BNB_WARNING), inherited) if p))

    def launch(self, case: Case, out: Path, tmp: Path) -> Launch:
        if case != "remedy":
            # A sample every 10 steps (the bed's one prompt: 2 euler steps, about 3 s on the CPU).
            argv = self.tree.command(out, "--sample_prompts", str(self.tree.root / "data" / "prompts.txt"),
                                     "--sample_every_n_steps", "10", "--sample_sampler", "euler")
            return Launch(argv, self.tree.sd_scripts, self.env(), resumes=True)
        # cache_latents in a --config_file and random_crop in the --dataset_config: real sd-scripts
        # refuses the pair ("when caching latents, either color_aug or random_crop cannot be used").
        config, dataset = self._remedy_files(tmp)
        argv = self.tree.command(out, "--config_file", str(config), "--cache_latents_to_disk", dataset=dataset,
                                 steps=10)
        return Launch(argv, self.tree.sd_scripts, self.env(), resumes=True)

    def other_run(self, out: Path, tmp: Path) -> tuple[Launch, str | None]:
        argv = replaced(self.tree.command(out, name="other"), "--network_dim", "8")
        return Launch(argv, self.tree.sd_scripts, self.env(), resumes=True), ".trainsup-other"

    def _remedy_files(self, tmp: Path, write: bool = True) -> tuple[Path, Path]:
        config, dataset = tmp / "config.toml", tmp / "dataset.toml"
        if write:
            config.write_text(CONFIG, encoding="utf-8")
            dataset.write_text(self._dataset_text(), encoding="utf-8")
            assert "random_crop = true" in dataset.read_text(encoding="utf-8")
        return config, dataset

    def _dataset_text(self) -> str:
        user = (self.tree.root / "data" / "dataset.toml").read_text(encoding="utf-8")
        return user.replace("[general]\n", "[general]\nrandom_crop = true\n")

    def trainer_process(self, trainsup_pid: int) -> psutil.Process | None:
        return realkohya.trainer_process(trainsup_pid)  # accelerate's child, not accelerate

    def process_pattern(self, out: Path) -> re.Pattern[str]:
        # accelerate launch ... train_network.py ... and the python it starts for the script
        return re.compile(rf"train_network\.py .*--output_dir {re.escape(str(out))}(?: |$)")

    def state_dir(self, out: Path, step: int) -> Path:
        return out / f"tiny-step{step:08d}-state"

    # The bed's command has no data-loader workers: sd-scripts fetches the resumed epoch's first batch
    # before it sets the epoch (docs/guides/resume.md; measured on this bed).
    resume_tolerance = 1e-3
    # Resumed at the end of epoch 1 (step 8), its labels run 8 behind: trainsup's cadences and a
    # relaunch at the end of epoch 2 (docs/guides/resume.md) may cost a state or two.
    resumed_extra_states = 2

    def comparable(self, rel: str) -> str:
        # sample/NAME_STEP6_II_TIMESTAMP[_SEED].png: each run samples at its own time of day
        return re.sub(r"_\d{14}(?=(?:_\d+)?\.png$)", "", rel)

    def weights_files(self, out: Path) -> list[Path]:
        return sorted([*out.glob("*.safetensors"), *out.glob("*-state/model.safetensors")])

    def load_weights(self, path: Path) -> dict[str, np.ndarray]:
        return load_file(str(path))

    def resume_point(self, run: Run, newest: int) -> tuple[str, int]:
        # Only an epoch's end resumes sd-scripts exactly (8 steps an epoch here): the state trainsup
        # saved at the end of epoch 1, which it keeps in its run dir, out of the output dir's sight.
        return str(run.run_dir / "saves" / "tiny-000001-state"), 8

    def state_weights(self, state: Path) -> Path:
        return state / "model.safetensors"

    @staticmethod
    def lora_keys(path: Path) -> set[str]:
        return set(load_file(str(path)))

    def check_clean(self, run: Run) -> None:
        out = run.out
        text = run.log_text(1)
        assert BNB in text and text.index(BNB) < text.index("steps:")  # printed before training started
        assert run.of("finished")[0]["final_weights"] == str(out / "tiny.safetensors")
        assert any(k.startswith("lora_unet_") for k in self.lora_keys(out / "tiny.safetensors"))
        # The dataset config ([general], [[datasets]], [[datasets.subsets]]) reached the trainer as a
        # derived copy that reads as the user's file.
        argv = run.starts()[0]["argv"]
        derived = Path(argv[argv.index("--dataset_config") + 1])
        assert derived == run.run_dir / "derived" / "attempt-1.dataset.toml"
        user = tomllib.loads((self.tree.root / "data" / "dataset.toml").read_text())
        assert tomllib.loads(derived.read_text()) == user and user["datasets"][0]["subsets"]
        ledger = json.loads((run.run_dir / "ledger.json").read_text())
        # Its step states, the end of each epoch but the last (8 steps an epoch; trainsup keeps those
        # in its run dir), and the final state.
        assert sorted(s["step"] for s in ledger["states"]) == [5, 8, 10, 15, 16, 20, 20]
        self.check_output_dir(run)
        clean = diagnose(run.log(1))
        assert clean["fault"] is None, clean

    def check_killed(self, run: Run) -> None:
        out = run.out
        assert "tiny-step00000010-state/random_states_0.pkl" in run.marks["digest"]
        assert run.of("attempt_end")[0]["child_signal"] == 9  # accelerate: `died with <Signals.SIGKILL: 9>`
        argv = run.starts()[1]["argv"]
        assert argv[argv.index("--resume") + 1] == str(run.run_dir / "saves" / "tiny-000001-state")
        assert argv[argv.index("--initial_step") + 1] == "8" and "--skip_until_initial_step" not in argv
        # Resumed at the end of epoch 1, sd-scripts labels its saves from 0: label L is step L + 8,
        # and it would train on to step 24 (the end of epoch 3). Step 10 is saved already; one cadence
        # for 15 and 20 (labels 7, 12) would save at every step, so trainsup gave it 7 (step 15), and
        # relaunched it from its state at the end of epoch 2 (step 16) with 4 (step 20), where it
        # stopped it. Each save is published under its true name; its own are kept in the run dir.
        assert argv[argv.index("--save_every_n_steps") + 1] == "7" and "--sample_at_first" not in argv
        assert [e["step"] for e in run.of("segment_relaunch")] == [16]
        third = run.starts()[2]
        assert (third["resume_step"], third["resume_from"]) == (
            16, str(run.run_dir / "saves" / "tiny-trainsup2-000002-state"))
        assert third["argv"][third["argv"].index("--save_every_n_steps") + 1] == "4" and len(run.starts()) == 3
        ledger = json.loads((run.run_dir / "ledger.json").read_text())
        offsets = {s["attempt"]: s["resume_step"] for s in run.starts()}
        resumed = [(s["label"], s["step"], s["attempt"]) for s in ledger["states"] if s["attempt"] >= 2]
        assert all(step == label + offsets[attempt] for label, step, attempt in resumed)
        assert max(step for _, step, _ in resumed) == 20 and not run.of("warning")
        assert sum(e["steps_trained"] for e in run.of("attempt_end")[1:]) == 12
        assert [e["step"] for e in run.of("sample_published")] == [20]  # attempt 3's label 4
        self.check_output_dir(run)
        assert self.lora_keys(out / "tiny.safetensors") == self.lora_keys(out / "tiny-step00000010.safetensors")
        killed = diagnose(run.log(1))
        assert "SIGKILL" in killed["evidence"], killed

    def check_output_dir(self, run: Run) -> None:
        """The names an uninterrupted run writes, each state with its true step, and its samples."""
        out = run.out
        want = sorted([f"tiny-step{s:08d}{end}" for s in (5, 10, 15, 20) for end in (".safetensors", "-state")]
                      + ["tiny.safetensors", "tiny-state", "sample"])
        assert sorted(p.name for p in out.iterdir() if p.name != ".trainsup") == want
        samples = sorted(self.comparable(p.name) for p in (out / "sample").iterdir())
        assert samples == ["tiny_000010_00_1.png", "tiny_000020_00_1.png"], samples  # prompt 0, --d 1
        for name, step in (("tiny-step00000015-state", 15), ("tiny-step00000020-state", 20), ("tiny-state", 20)):
            assert json.loads((out / name / "train_state.json").read_text())["current_step"] == step, name
        assert run.of("finished")[0]["final_weights"] == str(out / "tiny.safetensors")

    def check_cut(self, run: Run) -> None:
        # The resumed attempt writes under a name of its own, out of sight; the cut state is moved
        # aside whole and a complete save of step 10 published in its place.
        assert all("trainsup2" in Path(s["dir"]).name for s in run.of("state_saved") if s["attempt"] == 2)
        assert any(e["dir"] == str(self.state_dir(run.out, 10)) for e in run.of("state_set_aside"))
        self.check_output_dir(run)

    def check_remedy(self, run: Run) -> None:
        # trainsup drops the caching, never the augmentation: from a derived copy of each file.
        config, dataset = self._remedy_files(run.out.parent, write=False)
        fault = run.of("fault")[0]
        assert "when caching latents" in fault["evidence"]
        actions = run.of("remedy")[0]["actions"]
        assert any("remove --cache_latents" in a and str(config) in a for a in actions), actions
        argv2 = run.starts()[-1]["argv"]
        assert "--cache_latents_to_disk" not in argv2
        script_args = argv2[argv2.index("train_network.py"):]  # accelerate has a --config_file of its own
        assert argv2[argv2.index("--config_file") + 1] == str(self.tree.root / "accel.yaml")
        derived_config = Path(script_args[script_args.index("--config_file") + 1])
        derived_dataset = Path(script_args[script_args.index("--dataset_config") + 1])
        assert derived_config.parent == derived_dataset.parent == run.run_dir / "derived"
        assert "cache_latents" not in tomllib.loads(derived_config.read_text())["caching"]
        assert "# speed" in derived_config.read_text()  # the user's comments travel with the copy
        assert tomllib.loads(derived_dataset.read_text())["general"]["random_crop"] is True
        # the user's files are untouched
        assert config.read_text(encoding="utf-8") == CONFIG
        assert dataset.read_text(encoding="utf-8") == self._dataset_text()
        assert (run.out / "tiny.safetensors").is_file()
        assert not list(self.tree.root.joinpath("data/images").glob("*.npz"))
        # The copies are what the trainer read: its log names them.
        assert f"Loading dataset config from {derived_dataset}" in run.log_text(2)


# --- musubi-tuner ----------------------------------------------------------------------------------
class MusubiBed(Bed):
    """Real kohya-ss/musubi-tuner ``wan_train_network.py`` (a Wan2.1 T2V-1.3B LoRA on the CPU) under
    ``accelerate launch``, from ``BED/musubi-tuner``: resumes with ``--resume`` and the steps left,
    counting from 0 again; no sampling (it loads the 11 GB T5 at every launch). About 70 s a run idle."""

    name = "musubi"
    remedy_fault = "fp8_op_unsupported"
    # No musubi state resumes it exactly (its epoch count restarts at 1 after --resume, so the resumed
    # epoch's data order is not the uninterrupted run's): the residual measured on this bed's command
    # for the furthest resume point of the suite's cases, step 5 of the cut run (1.81e-2; from step 10:
    # 1.16e-2, held by tests/real_musubi).
    resume_tolerance = realmusubi.RESIDUAL_FROM_STEP_5
    long_cases = ("the seeded kills cost two more musubi runs (about 2.5 min idle, ~6.4 GB each); they run "
                  f"with {LONG}=1 (python3 -m pytest -q tests/behaviour -k musubi)")

    def _prepare(self) -> str | None:
        found = realmusubi.build_bed()
        if isinstance(found, str):
            return found
        self.tree = found
        return None

    def launch(self, case: Case, out: Path, tmp: Path) -> Launch:
        if case != "remedy":
            return Launch(self.tree.command(out), self.tree.musubi, self.tree.env(), resumes=True)
        # --fp8_base alone: float8 weights meet the float32 time embedding CPU autocast refuses to
        # cast, and the first step dies (`mat1 and mat2 must have the same dtype ... Float8_e4m3fn`).
        # 10 steps: --fp8_scaled trains at ~6 s a step here.
        return Launch(self.tree.command(out, "--fp8_base", steps=10), self.tree.musubi, self.tree.env(), resumes=True)

    def other_run(self, out: Path, tmp: Path) -> tuple[Launch, str | None]:
        argv = replaced(self.tree.command(out, name="other"), "--network_dim", "8")
        return Launch(argv, self.tree.musubi, self.tree.env(), resumes=True), ".trainsup-other"

    def trainer_process(self, trainsup_pid: int) -> psutil.Process | None:
        return realmusubi.trainer_process(trainsup_pid)  # accelerate's child, not accelerate

    def process_pattern(self, out: Path) -> re.Pattern[str]:
        return re.compile(rf"wan_train_network\.py .*--output_dir {re.escape(str(out))}(?: |$)")

    def state_dir(self, out: Path, step: int) -> Path:
        return out / f"tiny-step{step:08d}-state"

    def state_weights(self, state: Path) -> Path:
        return state / "model.safetensors"

    def weights_files(self, out: Path) -> list[Path]:
        return sorted([*out.glob("*.safetensors"), *out.glob("*-state/model.safetensors")])

    def load_weights(self, path: Path) -> dict[str, np.ndarray]:
        return load_file(str(path))

    def check_output_dir(self, run: Run) -> None:
        """The names an uninterrupted run writes, each state accelerate's four files."""
        want = sorted([f"tiny-step{s:08d}{end}" for s in (5, 10, 15, 20) for end in (".safetensors", "-state")]
                      + ["tiny.safetensors", "tiny-state"])
        assert sorted(p.name for p in run.out.iterdir() if p.name != ".trainsup") == want
        for state in run.out.glob("*-state"):
            assert sorted(p.name for p in state.iterdir()) == [
                "model.safetensors", "optimizer.bin", "random_states_0.pkl", "scheduler.bin"], state
        assert run.of("finished")[0]["final_weights"] == str(run.out / "tiny.safetensors")

    def check_clean(self, run: Run) -> None:
        assert sorted(s["step"] for s in run.of("state_saved")) == [5, 10, 15, 20, 20]
        assert any(k.startswith("lora_unet_blocks_") for k in load_file(str(run.out / "tiny.safetensors")))
        self.check_output_dir(run)
        clean = diagnose(run.log(1))
        assert clean["fault"] is None, clean

    def check_killed(self, run: Run) -> None:
        assert "tiny-step00000010-state/random_states_0.pkl" in run.marks["digest"]
        assert run.of("attempt_end")[0]["child_signal"] == 9  # accelerate: `died with <Signals.SIGKILL: 9>`
        argv = run.starts()[1]["argv"]
        assert argv[argv.index("--resume") + 1] == str(self.state_dir(run.out, 10))
        # musubi counts from 0 again after --resume: the steps left, and never --initial_step
        assert argv[argv.index("--max_train_steps") + 1] == "10" and "--initial_step" not in argv
        assert argv[argv.index("--output_name") + 1] == "tiny-trainsup2" and len(run.starts()) == 2
        assert run.of("attempt_end")[-1]["steps_trained"] == 10
        self.check_output_dir(run)
        killed = diagnose(run.log(1))
        assert "SIGKILL" in killed["evidence"], killed

    def check_cut(self, run: Run) -> None:
        # Resumed from step 5 under a name of its own; the cut state moved aside whole, a complete save
        # of step 10 published in its place.
        assert all("trainsup2" in Path(s["dir"]).name for s in run.of("state_saved") if s["attempt"] == 2)
        assert any(e["dir"] == str(self.state_dir(run.out, 10)) for e in run.of("state_set_aside"))
        self.check_output_dir(run)

    def check_remedy(self, run: Run) -> None:
        fault = run.of("fault")[0]
        assert "Float8_e4m3fn" in (fault["evidence"] or ""), fault
        assert run.of("remedy")[0]["actions"] == ["add --fp8_scaled"], run.of("remedy")
        argv2 = run.starts()[1]["argv"]
        assert "--fp8_base" in argv2 and "--fp8_scaled" in argv2 and run.starts()[1]["resume_from"] is None
        text = run.log_text(2)
        assert "Number of optimized Linear layers" in text and "Float8_e4m3fn" not in text  # trained in float8
        assert (run.out / "tiny.safetensors").is_file() and len(run.starts()) == 2


# --- LitGPT ----------------------------------------------------------------------------------------
LITGPT_SETUP = ROOT.parent / "shared" / "reallitgpt" / "setup"


class LitgptBed(Bed):
    """The real ``litgpt`` CLI (0.5.13, tiny random model on CPU), one bed per training method:
    ``finetune_full`` resumes from a step folder; ``finetune_lora`` cannot (a restart starts from step
    0, into an out dir of its own)."""

    remedy_fault = "lr_schedule"

    def __init__(self, method: Literal["finetune_full", "finetune_lora"]) -> None:
        super().__init__()
        self.method = method
        self.name = f"litgpt-{method.removeprefix('finetune_')}"

    def _prepare(self) -> str | None:
        if os.environ.get("TRAINSUP_REALLITGPT") != "1":
            return ("TRAINSUP_REALLITGPT is not 1: set it (and TRAINSUP_REALLITGPT_DIR, default "
                    "~/.cache/trainsup-reallitgpt) to run the real LitGPT tier")
        self.root = _litgpt_root()
        return None

    def command(self, out: Path, warmup: int = 2) -> list[str]:
        """The README's working command, for this bed's method."""
        d = self.root
        return [str(d / "venv/bin/litgpt"), self.method, str(d / "checkpoints/tiny-gpt"), "--out_dir", str(out),
                "--precision", "32-true", "--data", "JSON", "--data.json_path", str(d / "data/instructions.json"),
                "--data.val_split_fraction", "0.125", "--data.num_workers", "0",
                "--train.global_batch_size", "4", "--train.micro_batch_size", "4", "--train.epochs", "1000",
                "--train.max_steps", "20", "--train.save_interval", "5", "--train.lr_warmup_steps", str(warmup),
                "--eval.interval", "10", "--eval.max_iters", "2", "--eval.max_new_tokens", "8"]

    def launch(self, case: Case, out: Path, tmp: Path) -> Launch:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSUP_DEMO_")}
        env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        # remedy: a warmup as long as the run; the cosine phase then divides by zero at the last step
        argv = self.command(out, warmup=20 if case == "remedy" else 2)
        return Launch(argv, tmp, env, resumes=self.method == "finetune_full")

    def other_run(self, out: Path, tmp: Path) -> tuple[Launch, str | None]:
        # LitGPT has no output name: another run is another recipe in the same --out_dir (a longer
        # warmup; LoRA: another rank), its run dir .trainsup-run (named after no output name).
        argv = self.command(out, warmup=3)
        if self.method == "finetune_lora":
            argv += ["--lora_r", "16"]
        launch = self.launch("clean", out, tmp)
        return Launch(argv, tmp, launch.env, resumes=launch.resumes), ".trainsup-run"

    def trainer_process(self, trainsup_pid: int) -> psutil.Process | None:
        for p in children(trainsup_pid):
            argv = cmdline(p)
            if any(Path(a).name == "litgpt" for a in argv[:2]) and self.method in argv:
                return p
        return None

    def process_pattern(self, out: Path) -> re.Pattern[str]:
        return re.compile(rf"/litgpt {self.method} .*--out_dir {re.escape(str(out))}(?: |$)")

    def state_dir(self, out: Path, step: int) -> Path:
        return out / f"step-{step:06d}"

    log_dirs = ("logs",)

    def weights_files(self, out: Path) -> list[Path]:
        return sorted(out.glob("*/lit_model.pth*"))

    def load_weights(self, path: Path) -> dict[str, np.ndarray]:
        import torch  # the test extra's CPU torch: LitGPT saves torch pickles

        data = torch.load(path, map_location="cpu", weights_only=False)
        model = data.get("model", data) if isinstance(data, dict) else data
        return {k: v.detach().float().numpy() for k, v in model.items() if hasattr(v, "detach")}

    def state_weights(self, state: Path) -> Path:
        return state / ("lit_model.pth" if self.method == "finetune_full" else "lit_model.pth.lora")

    def check_clean(self, run: Run) -> None:
        assert (run.out / "final" / "lit_model.pth").is_file()
        assert [s["step"] for s in run.of("state_saved")][:4] == [5, 10, 15, 20]

    def check_killed(self, run: Run) -> None:
        argv1, argv2 = run.starts()[0]["argv"], run.starts()[-1]["argv"]
        if self.method == "finetune_lora":
            # No resume: LitGPT would write step-000005/... over attempt 1's, file by file.
            assert value_after(argv2, "--out_dir") != str(run.out), argv2
        else:
            assert value_after(argv2, "--out_dir") == value_after(argv1, "--out_dir") == str(run.out)
        assert (run.out / "final" / "lit_model.pth").is_file()

    def check_remedy(self, run: Run) -> None:
        fault = run.of("fault")[0]
        assert "ZeroDivisionError" in (fault["evidence"] or ""), fault
        argv2 = run.starts()[1]["argv"]
        assert value_after(argv2, "--train.lr_warmup_steps") == "19", argv2
        # LitGPT keeps the LR schedule in its states: the corrected run starts from step 0, and not in
        # the out dir whose step folders it would overwrite.
        assert run.starts()[1]["resume_from"] is None and value_after(argv2, "--out_dir") != str(run.out)
        final = Path(run.of("finished")[0]["final_weights"])
        trained = yaml.safe_load((final / "hyperparameters.yaml").read_text())
        assert trained["train"]["lr_warmup_steps"] == 19 and trained["train"]["max_steps"] == 20
        assert "| iter 20 step 20 |" in run.log_text(2)


def _litgpt_root() -> Path:
    where = os.environ.get("TRAINSUP_REALLITGPT_DIR") or str(Path.home() / ".cache" / "trainsup-reallitgpt")
    if not LITGPT_SETUP.is_file():
        raise RuntimeError(f"TRAINSUP_REALLITGPT=1: no bed builder at {LITGPT_SETUP}")
    done = subprocess.run(["bash", str(LITGPT_SETUP), where], capture_output=True, text=True, timeout=3600,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building the LitGPT bed failed ({LITGPT_SETUP} {where}):\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


# --- diffusers' example scripts ---------------------------------------------------------------------
class DiffusersBed(Bed):
    """diffusers' unmodified ``train_text_to_image_lora.py`` (a LoRA of a tiny random SD pipeline on the
    CPU) under ``accelerate launch``: checkpoints ``out/checkpoint-N/``, resumed by name, 8 steps an epoch
    and one every 5, so ``checkpoint-5`` and ``checkpoint-10`` are mid-epoch and the exact resume point
    within two intervals is the run's start. About 10 s a run."""

    name = "diffusers"
    remedy_fault = "flag_conflict"
    # Every case here restarts from step 0 (bit-exact); a seeded kill that lands after checkpoint-15 resumes
    # from there, mid-epoch: the residual measured by tests/real_diffusers.
    resume_tolerance = realdiffusers.RESIDUAL
    log_dirs = ("logs",)  # tensorboard: each launch starts event files of its own

    def _prepare(self) -> str | None:
        found = realdiffusers.build_bed()
        if isinstance(found, str):
            return found
        self.tree = found
        return None

    def launch(self, case: Case, out: Path, tmp: Path) -> Launch:
        # remedy: a command copied from a GPU box, xformers attention without xformers on the bed
        extra = ("--enable_xformers_memory_efficient_attention",) if case == "remedy" else ()
        return Launch(self.tree.command(out, *extra), tmp, self.tree.env(), resumes=True)

    def other_run(self, out: Path, tmp: Path) -> tuple[Launch, str | None]:
        # No output names: another run's checkpoint-N would land on the first run's names (refused).
        argv = replaced(self.tree.command(out), "--learning_rate", "2e-04")
        return Launch(argv, tmp, self.tree.env(), resumes=True), None

    def trainer_process(self, trainsup_pid: int) -> psutil.Process | None:
        for p in children(trainsup_pid):
            argv = cmdline(p)
            if len(argv) > 1 and Path(argv[1]).name == realdiffusers.SCRIPT:
                return p  # accelerate's child, not accelerate
        return None

    def process_pattern(self, out: Path) -> re.Pattern[str]:
        return re.compile(rf"{re.escape(realdiffusers.SCRIPT)} .*--output_dir {re.escape(str(out))}(?: |$)")

    def state_dir(self, out: Path, step: int) -> Path:
        return out / f"checkpoint-{step}"

    def state_weights(self, state: Path) -> Path:
        return state / "pytorch_lora_weights.safetensors"

    def resume_point(self, run: Run, newest: int) -> tuple[str, int]:
        # the run's start is an epoch's end within two checkpoint intervals of step 5 and of step 10
        return (None, 0) if newest <= 10 else super().resume_point(run, newest)  # type: ignore[return-value]

    def weights_files(self, out: Path) -> list[Path]:
        return sorted([*out.glob("checkpoint-*/pytorch_lora_weights.safetensors"),
                       out / "pytorch_lora_weights.safetensors"])

    def load_weights(self, path: Path) -> dict[str, np.ndarray]:
        return load_file(str(path))

    def check_output_dir(self, run: Run) -> None:
        want = sorted([f"checkpoint-{s}" for s in (5, 10, 15, 20)] + ["logs", "pytorch_lora_weights.safetensors"])
        assert sorted(p.name for p in run.out.iterdir() if p.name != ".trainsup") == want
        for state in run.out.glob("checkpoint-*"):
            assert sorted(p.name for p in state.iterdir()) == [
                "optimizer.bin", "pytorch_lora_weights.safetensors", "random_states_0.pkl", "scheduler.bin"], state
        assert run.of("finished")[0]["final_weights"] == str(run.out / "pytorch_lora_weights.safetensors")

    def check_clean(self, run: Run) -> None:
        assert [s["step"] for s in run.of("state_saved")] == [5, 10, 15, 20]
        assert "--resume_from_checkpoint" not in run.starts()[0]["argv"]
        self.check_output_dir(run)
        clean = diagnose(run.log(1))
        assert clean["fault"] is None, clean

    def check_killed(self, run: Run) -> None:
        assert "checkpoint-10/random_states_0.pkl" in run.marks["digest"]
        assert run.of("attempt_end")[0]["child_signal"] == 9  # accelerate: `died with <Signals.SIGKILL: 9>`
        exact = run.of("resume_exact")
        assert exact and exact[-1]["epoch_end"] == 0, exact
        assert "--resume_from_checkpoint" not in run.starts()[1]["argv"] and len(run.starts()) == 2
        self.check_output_dir(run)
        killed = diagnose(run.log(1))
        assert "SIGKILL" in killed["evidence"], killed

    def check_cut(self, run: Run) -> None:
        # the cut checkpoint-10 moved aside whole, never deleted; the fresh attempt wrote its own
        assert any(e["dir"] == str(self.state_dir(run.out, 10)) for e in run.of("state_set_aside"))
        self.check_output_dir(run)

    def check_remedy(self, run: Run) -> None:
        fault = run.of("fault")[0]
        assert "xformers is not available" in (fault["evidence"] or ""), fault
        assert run.of("remedy")[0]["actions"] == ["remove --enable_xformers_memory_efficient_attention"]
        first, second = run.starts()[0]["argv"], run.starts()[1]["argv"]
        assert second == [a for a in first if a != "--enable_xformers_memory_efficient_attention"]
        self.check_output_dir(run)


def _live(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# --- two real ranks: the Hugging Face Trainer under torchrun -----------------------------------------
class HfRanksBed(Bed):
    """TRL's unmodified ``sft.py`` (transformers' Trainer) under ``torchrun --nproc_per_node 2``: two DDP ranks
    over gloo on the CPU (``--use_cpu true``), the command of ``tests/real_ranks``. ``checkpoint-N/``, resumed
    by ``--resume_from_checkpoint`` (mid-epoch too: the Trainer skips the batches it trained), bit-exact. At
    ~27 steps a second, 20 steps are gone before a kill lands: its runs are 200 steps, a state every 50
    (``step_scale`` 10). The process a kill takes down is rank 1, never the launcher: trainsup must see the
    rank's end and stop the others itself. About 20 s a run, most of it start-up."""

    name = "hf-ranks"
    remedy_fault = "bf16_unsupported"
    step_scale = 10
    long_cases = "the seeded kills: two more two-rank runs (~20 s each), with TRAINSUP_LONG=1"

    def _prepare(self) -> str | None:
        found = realhf.build_bed()
        if isinstance(found, str):
            return found
        self.tree = found
        return None

    def command(self, out: Path, bf16_off: bool = True, lr: str | None = None) -> list[str]:
        """``bf16_off`` False: the command as copied from a GPU box, with neither ``--bf16 false`` nor
        ``--use_cpu true`` (with ``--use_cpu`` the Trainer takes bf16 on the CPU and nothing fails)."""
        r = self.tree.root
        sft = next((r / "venv" / "lib").glob("python3*/site-packages/trl/scripts/sft.py"))
        return [str(r / "venv" / "bin" / "torchrun"), "--nproc_per_node", "2", str(sft),
                "--model_name_or_path", str(r / "model" / "tiny-llama"), "--dataset_name", str(r / "data" / "chat"),
                "--output_dir", str(out), "--max_steps", str(self.at(20)), "--save_steps", str(self.at(5)),
                "--logging_steps", "1", "--per_device_train_batch_size", "8", "--ddp_backend", "gloo",
                *(["--use_cpu", "true", "--bf16", "false"] if bf16_off else []),
                *(["--learning_rate", lr] if lr else [])]

    def env(self) -> dict[str, str]:
        return self.tree.env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")

    def launch(self, case: Case, out: Path, tmp: Path) -> Launch:
        # remedy: TRL's bf16 default, which the Trainer refuses on every rank here (no GPU); fixed, the two
        # ranks train each on its own (without --use_cpu the Trainer does not run them as DDP)
        return Launch(self.command(out, bf16_off=case != "remedy"), tmp, self.env(), resumes=True)

    def other_run(self, out: Path, tmp: Path) -> tuple[Launch, str | None]:
        # No output names: another run's checkpoint-N would land on the first run's names (refused).
        return Launch(self.command(out, lr="1e-4"), tmp, self.env(), resumes=True), None

    def trainer_process(self, trainsup_pid: int) -> psutil.Process | None:
        for p in children(trainsup_pid):
            argv = cmdline(p)
            try:
                rank = p.environ().get("RANK")
            except psutil.Error:
                continue
            if any(Path(a).name == realhf.CHILD for a in argv[1:3]) and rank == "1":
                return p  # rank 1, torchrun's child (`python -u sft.py ...`)
        return None

    def process_pattern(self, out: Path) -> re.Pattern[str]:
        # torchrun ... sft.py ... and the two ranks it starts
        return re.compile(rf"{re.escape(realhf.CHILD)} .*--output_dir {re.escape(str(out))}(?: |$)")

    def settle(self, out: Path) -> None:
        # Rank 0 trains on (it rewrites TRL's README.md model card at each save) until trainsup stops it.
        pattern = self.process_pattern(out)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not [p for p in psutil.process_iter() if pattern.search(" ".join(cmdline(p))) and _live(p)]:
                return
            time.sleep(0.05)

    def state_dir(self, out: Path, step: int) -> Path:
        return out / f"checkpoint-{step}"

    def state_weights(self, state: Path) -> Path:
        return state / "model.safetensors"

    log_dirs = ("runs",)  # tensorboard, where installed: each launch its own event files

    def weights_files(self, out: Path) -> list[Path]:
        return sorted([*out.glob("checkpoint-*/model.safetensors"), out / "model.safetensors"])

    def load_weights(self, path: Path) -> dict[str, np.ndarray]:
        return load_file(str(path))

    def check_ranks(self, run: Run) -> None:
        found = [e for e in run.of("ranks") if e["attempt"] == 1]
        assert found and [r["rank"] for r in found[-1]["ranks"]] == [0, 1], run.of("ranks")

    def check_clean(self, run: Run) -> None:
        self.check_ranks(run)
        assert [s["step"] for s in run.of("state_saved")] == [50, 100, 150, 200]
        assert not run.of("rank_ended") or all(e["exit_code"] in (0, None) for e in run.of("rank_ended"))
        assert run.of("finished")[0]["final_weights"] == str(run.out / "model.safetensors")

    def check_killed(self, run: Run) -> None:
        self.check_ranks(run)
        ended = [e for e in run.of("rank_ended") if e["attempt"] == 1]
        print("hf-ranks killed:", ended, run.of("attempt_end")[0])
        assert any((e["rank"], e["pid"]) == (1, run.marks["killed"]) for e in ended), ended
        argv = run.starts()[1]["argv"]
        assert argv[argv.index("--resume_from_checkpoint") + 1] == str(self.state_dir(run.out, 100))

    def check_cut(self, run: Run) -> None:
        assert any(e["dir"] == str(self.state_dir(run.out, 100)) for e in run.of("state_set_aside"))

    def check_remedy(self, run: Run) -> None:
        first, second = run.starts()[0]["argv"], run.starts()[1]["argv"]
        assert second == [*first, "--bf16", "false"], second
        assert run.starts()[1]["resume_from"] is None  # it failed before a checkpoint was written
        assert [s["step"] for s in run.of("state_saved")] == [50, 100, 150, 200]


# --- a trainer of its own shape, declared in a project's trainer: section ---------------------------
OWN_SHAPE = str(ROOT / "tests" / "children" / "own_shape_trainer.py")


def own_shape_weight(steps: int = 20) -> float:
    """The weight own_shape_trainer.py ends with after ``steps`` uninterrupted steps."""
    weight = 1.0
    for step in range(1, steps + 1):
        weight = weight * 0.97 + step * 1e-3
    return weight


class OwnShapeBed(Bed):
    """tests/children/own_shape_trainer.py (no torch, no download), known to trainsup only through a
    project's declarative ``trainer:`` section: always here. A state is ``ckpt-N/`` with
    ``weight.json`` then ``done.marker``; it resumes exactly with ``--from``."""

    name = "own-shape"
    remedy_fault = "cuda_oom"

    def _prepare(self) -> str | None:
        return None

    def launch(self, case: Case, out: Path, tmp: Path) -> Launch:
        # 0.2 s a step: a state every 1.2 s, longer than trainsup's look on disk (0.5 s), so the
        # state_saved of step 10 is journaled before step 15 is saved.
        argv = [sys.executable, OWN_SHAPE, "--out", str(out), "--steps", "20", "--every", "5", "--step-seconds", "0.2"]
        trainer = {"states": str(out / "ckpt-*"), "complete": "done.marker", "step": r"ckpt-(\d+)$",
                   "resume": ["--from", "{state}"],
                   "progress": r"\[step (?P<step>\d+)/(?P<total>\d+)\] loss=(?P<loss>\S+)", "success": "^all done$"}
        # remedy: out of (simulated) GPU memory at step 12 unless the allocator setting is there
        env = clean_env(**({"OWN_SHAPE_OOM_AT": "12"} if case == "remedy" else {}))
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        return Launch(argv, ROOT, env, resumes=True, trainer=trainer)

    def trainer_process(self, trainsup_pid: int) -> psutil.Process | None:
        for p in children(trainsup_pid):
            argv = cmdline(p)
            if len(argv) > 1 and argv[1] == OWN_SHAPE:
                return p
        return None

    def process_pattern(self, out: Path) -> re.Pattern[str]:
        return re.compile(rf"{re.escape(OWN_SHAPE)} --out {re.escape(str(out))}(?: |$)")

    def other_run(self, out: Path, tmp: Path) -> tuple[Launch, str | None]:
        # No output names: another run's ckpt-N would be the first run's names.
        launch = self.launch("clean", out, tmp)
        return Launch([*launch.argv[:-1], "0.1"], launch.cwd, launch.env, True, launch.trainer), None

    def state_dir(self, out: Path, step: int) -> Path:
        return out / f"ckpt-{step}"

    def state_weights(self, state: Path) -> Path:
        return state / "weight.json"

    def weights_files(self, out: Path) -> list[Path]:
        return sorted([*out.glob("ckpt-*/weight.json"), out / "final.json"])

    def load_weights(self, path: Path) -> dict[str, np.ndarray]:
        return {"weight": np.array(json.loads(path.read_text())["weight"])}

    def cut_state(self, state: Path) -> None:
        # This trainer writes done.marker after the weights: a save cut half-way has none.
        super().cut_state(state)
        (state / "done.marker").unlink()

    def _assert_exact(self, run: Run) -> None:
        final = json.loads((run.out / "final.json").read_text())
        assert math.isclose(final["weight"], own_shape_weight(), rel_tol=0, abs_tol=1e-12), final

    def check_clean(self, run: Run) -> None:
        self._assert_exact(run)
        assert [s["step"] for s in run.of("state_saved")] == [5, 10, 15, 20]

    def check_killed(self, run: Run) -> None:
        self._assert_exact(run)  # resumed exactly: the weight of an uninterrupted run

    def check_cut(self, run: Run) -> None:
        self._assert_exact(run)
        aside = [Path(e["dir"]).name for e in run.of("state_set_aside")]
        assert "ckpt-10" in aside, aside  # moved out of the resumed trainer's way, never deleted

    def check_remedy(self, run: Run) -> None:
        assert run.starts()[0]["env"] == {}
        assert run.starts()[1]["env"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
        assert run.starts()[1]["resume_from"] == str(self.state_dir(run.out, 10))
        assert "[step 12/20]" in run.log_text(2) and "CUDA out of memory" not in run.log_text(2)
        self._assert_exact(run)


BEDS: tuple[Bed, ...] = (KohyaBed(), MusubiBed(), LitgptBed("finetune_full"), LitgptBed("finetune_lora"),
                         DiffusersBed(), HfRanksBed(),
                         OwnShapeBed())
