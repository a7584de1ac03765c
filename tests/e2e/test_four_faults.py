"""The four documented faults, each from its broken command line to a finished run.

Each test: the fault is real (or, where a CPU cannot produce it, simulated behind the demo's
explicit switch); `trainsup run` exits 0; the journal names the class and the remedy; the attempt
after the fault resumed from the newest complete state, not from step 0; the final weights equal an
uninterrupted run with the corrected flags and the same seed; and every state and weights file that
existed at the fault is byte-identical afterwards.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.e2e.demo_harness import (
    FAST_POLICY,
    assert_same_weights,
    assert_untouched,
    clean_env,
    copy_state,
    demo_argv,
    run_plain,
    supervise,
)


def reference(assets: dict[str, Path], tmp: Path, script: str, *flags: str, **kw: object) -> Path:
    out = tmp / "reference"
    r = run_plain(demo_argv(script, assets, out, *flags, **kw))  # type: ignore[arg-type]
    assert r.returncode == 0 and "model saved." in r.stderr, r.stderr[-3000:]
    return out


def resumed_attempt(run, state: Path | str, step: int) -> None:
    starts = run.of("attempt_start")
    assert len(starts) >= 2
    assert starts[-1]["resume_from"] == str(state) and starts[-1]["resume_step"] == step
    argv = starts[-1]["argv"]
    assert argv[argv.index("--resume") + 1] == str(state) and argv[argv.index("--initial_step") + 1] == str(step)
    # kohya resumes exactly without skipping batches only at an epoch's end (4 steps an epoch here);
    # before its start-up summary told trainsup the epoch's length, trainsup keeps skipping
    assert "--skip_until_initial_step" in argv or step % 4 == 0


def test_meta_tensor_adds_fp8_base_and_resumes(assets: dict[str, Path], tmp_path: Path) -> None:
    fixed = ("--fp8_base", "--mixed_precision", "bf16")
    ref = reference(assets, tmp_path, "flux_train_network", *fixed, model="model_fp8")
    out = tmp_path / "out"
    user_state = copy_state(ref, out, 8)  # the user resumes an earlier run with the fp8 repack
    broken = demo_argv("flux_train_network", assets, out, "--resume", str(user_state), model="model_fp8")
    run = supervise(broken, out, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert [f["class"] for f in run.of("fault")] == ["meta_tensor"]
    remedy = run.of("remedy")[0]
    assert remedy["class"] == "meta_tensor" and "add --fp8_base" in remedy["actions"][0]
    assert "--fp8_base" in run.of("attempt_start")[-1]["argv"]
    resumed_attempt(run, user_state, 8)
    assert_same_weights(out / "lora.safetensors", ref / "lora.safetensors")
    assert_untouched(run, out)


def test_device_mismatch_drops_latent_caching_from_the_config_file(assets: dict[str, Path],
                                                                    tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    shutil.copy(assets["prompts"], prompts)
    sampling = ("--sample_prompts", str(prompts), "--sample_every_n_steps", "10")
    ref = reference(assets, tmp_path, "train_network", *sampling)
    config = tmp_path / "user.toml"
    config.write_text("[training]\ncache_latents = true\nnetwork_dim = 4\n")
    before = config.read_bytes()
    out = tmp_path / "out"
    broken = demo_argv("train_network", assets, out, "--config_file", str(config), *sampling)
    run = supervise(broken, out, tmp_path, env=clean_env(TRAINSUP_DEMO_SIMULATE="device_mismatch"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert [f["class"] for f in run.of("fault")] == ["device_mismatch"]
    actions = run.of("remedy")[0]["actions"]
    assert any("cache_latents" in a and "derived" in a for a in actions)
    argv = run.of("attempt_start")[-1]["argv"]
    derived = Path(argv[argv.index("--config_file") + 1])
    assert derived.parent == out / ".trainsup" / "derived" and "cache_latents" not in derived.read_text()
    assert config.read_bytes() == before  # the user's file is never modified
    # Sampling at step 10 crashed before the step-10 save: the newest complete state is step 8.
    resumed_attempt(run, out / "lora-step00000008-state", 8)
    assert_same_weights(out / "lora.safetensors", ref / "lora.safetensors")
    assert_untouched(run, out)


def test_prompt_edit_under_te_caching_restarts_from_the_last_state(assets: dict[str, Path],
                                                                    tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    shutil.copy(assets["prompts"], prompts)
    flags = ("--cache_text_encoder_outputs", "--sample_prompts", str(prompts), "--sample_every_n_steps", "10")
    ref = reference(assets, tmp_path, "flux_train_network", *flags)
    out = tmp_path / "out"
    edited = []

    def edit_after_first_state(event: dict) -> None:
        if event["event"] == "state_saved" and not edited:
            prompts.write_text("a red fox in fresh snow --w 16 --h 16 --s 4\n")
            edited.append(event["step"])

    # Prompt protection (snapshots) would keep the edit from the trainer; turned off, the fault is
    # real and trainsup must recover from it.
    run = supervise(demo_argv("flux_train_network", assets, out, *flags), out, tmp_path,
                    env=clean_env(TRAINSUP_DEMO_STEP_SECONDS="0.15"), on_event=edit_after_first_state,
                    policy=FAST_POLICY + "live:\n  snapshot_prompts: false\n")
    assert run.returncode == 0, run.stderr[-3000:]
    assert edited == [4]
    assert [f["class"] for f in run.of("fault")] == ["te_cache_none"]
    assert "'NoneType' object has no attribute 'to'" in run.of("fault")[0]["evidence"]
    assert run.of("remedy")[0]["actions"] == ["restart from the last safe state"]
    resumed_attempt(run, out / "lora-step00000008-state", 8)
    assert_same_weights(out / "lora.safetensors", ref / "lora.safetensors")
    assert_untouched(run, out)


def test_fp8_serializer_keyerror_upgrades_and_never_resumes_the_failed_state(
        assets: dict[str, Path], tmp_path: Path, old_safetensors_python: str) -> None:
    # kohya's --fp8_base casts the base model to float8 in memory; the first state save then needs a
    # safetensors that can write float8. No state from this interpreter can be complete, so the
    # attempt after the upgrade starts over, and never from the half-written state.
    fp8 = ("--fp8_base", "--mixed_precision", "bf16")
    ref = reference(assets, tmp_path, "flux_train_network", *fp8)
    out = tmp_path / "out"
    run = supervise(demo_argv("flux_train_network", assets, out, *fp8, python=old_safetensors_python), out, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    faults = run.of("fault")
    assert [f["class"] for f in faults] == ["fp8_serializer"]
    assert "KeyError: torch.float8_e4m3fn" in faults[0]["evidence"]
    upgrade = run.of("environment_upgrade")[0]
    assert (upgrade["python"], upgrade["spec"], upgrade["exit_code"]) == (old_safetensors_python,
                                                                          "safetensors>=0.4.2", 0)
    assert safetensors_version(old_safetensors_python) != "0.4.1"
    # The half-written state is moved aside whole (still marked bad), and the fresh start's complete
    # save of step 4 is published under its name.
    partial = out / "lora-step00000004-state"
    aside = [e for e in run.of("state_set_aside") if e["dir"] == str(partial)]
    assert aside and not (Path(aside[0]["to"]) / "random_states_0.pkl").exists()
    assert aside[0]["to"] in json.loads((run.run_dir / "ledger.json").read_text())["bad_states"]
    assert (partial / "random_states_0.pkl").exists()
    assert run.of("attempt_start")[-1]["resume_from"] is None
    assert_same_weights(out / "lora.safetensors", ref / "lora.safetensors")
    assert_untouched(run, out)


def test_fp8_serializer_too_old_to_resume_upgrades_and_resumes_the_newest_state(
        assets: dict[str, Path], tmp_path: Path, old_safetensors_python: str) -> None:
    # The user resumes, with the same flags, a state saved by a sound environment; this trainer's
    # safetensors cannot load it (`load_model() got an unexpected keyword argument 'device'`).
    fp8 = ("--fp8_base", "--mixed_precision", "bf16")
    ref = reference(assets, tmp_path, "flux_train_network", *fp8)
    out = tmp_path / "out"
    user_state = copy_state(ref, out, 8)
    broken = demo_argv("flux_train_network", assets, out, *fp8, "--resume", str(user_state),
                       python=old_safetensors_python)
    run = supervise(broken, out, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert [f["class"] for f in run.of("fault")] == ["fp8_serializer"]
    assert "unexpected keyword argument 'device'" in run.of("fault")[0]["evidence"]
    assert run.of("environment_upgrade")[0]["spec"] == "safetensors>=0.4.3"
    resumed_attempt(run, user_state, 8)
    assert_same_weights(out / "lora.safetensors", ref / "lora.safetensors")
    assert_untouched(run, out)


def safetensors_version(python: str) -> str:
    code = "import safetensors; print(safetensors.__version__)"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_fp8_checkpoint_under_an_old_safetensors_is_fp8_serializer_and_loads_after_the_upgrade(
        assets: dict[str, Path], tmp_path: Path, old_safetensors_python: str) -> None:
    # safetensors 0.4.1 cannot even read a float8 checkpoint (`Dtype not understood: F8_E4M3`):
    # the same cause as the KeyError on save, the same remedy; a plain restart would fail forever.
    fp8 = ("--fp8_base", "--mixed_precision", "bf16")
    ref = reference(assets, tmp_path, "flux_train_network", *fp8, model="model_fp8")
    out = tmp_path / "out"
    run = supervise(demo_argv("flux_train_network", assets, out, *fp8, model="model_fp8",
                              python=old_safetensors_python), out, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    faults = run.of("fault")
    assert [f["class"] for f in faults] == ["fp8_serializer"]
    assert "Dtype not understood: F8_E4M3" in faults[0]["evidence"]
    assert run.of("environment_upgrade")[0]["spec"] == "safetensors>=0.4.2"
    assert safetensors_version(old_safetensors_python) != "0.4.1"
    assert run.of("attempt_start")[-1]["resume_from"] is None  # it failed at load: nothing to resume
    assert_same_weights(out / "lora.safetensors", ref / "lora.safetensors")
