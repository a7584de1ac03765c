"""A run is one run (issue 29), as a newcomer meets it with the demo trainer: kohya users re-use one
output folder for many LoRAs.

- a second run (another output name, another network dim) in the output dir where the first run's
  states lie, the first stopped by a give-up or by Ctrl-C: the second trains from step 0 in a run
  dir of its own, says so in one line, and the first run's files stay byte-identical; the second's
  weights equal a bare run of its own command (nothing of the first mixed in);
- the same command again after it finished: nothing is trained, the weights stay byte-identical, and
  trainsup says where they are (exit 0);
- ``--resume`` with nothing of this run there: one error line, exit 2, nothing made;
- a new run whose output name already holds another run's weights: refused, nothing touched.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from tests.conftest import ROOT, trainsup_cmd, wait_until
from tests.e2e.demo_harness import FAST_POLICY, assert_same_weights, clean_env, digest_tree, run_plain
from trainsup.record.journal import read_events


def lora_argv(assets: dict[str, Path], out: Path, name: str, seed: int, *extra: str) -> list[str]:
    return ["python", "-m", "trainsup.demo.train_network", "--pretrained_model_name_or_path", str(assets["model"]),
            "--train_data_dir", str(assets["dataset"]), "--output_dir", str(out), "--output_name", name,
            "--max_train_steps", "16", "--save_every_n_steps", "4", "--save_state", "--seed", str(seed),
            "--train_batch_size", "2", "--learning_rate", "1e-3", *extra]


def run(argv: list[str], policy: Path, *opts: str, env: dict[str, str] | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(trainsup_cmd("run", "--quiet", "--policy", str(policy), *opts, "--", *argv), cwd=ROOT,
                          env=env or clean_env(), capture_output=True, text=True, timeout=timeout, check=False)


def policy_file(tmp: Path, extra: str = "") -> Path:
    path = tmp / "policy.yaml"
    path.write_text(FAST_POLICY + extra, encoding="utf-8")
    return path


def everything(out: Path, prefix: str) -> dict[str, str]:
    """Every file of one run's output names, with its digest (states and weights)."""
    return {k: v for k, v in digest_tree(out).items() if k.startswith(prefix)}


def second_run_is_its_own(assets: dict[str, Path], out: Path, tmp: Path, first: str) -> None:
    """``style`` (another name and network dim) where ``first``'s states lie: fresh, separate, exact."""
    before = everything(out, first)
    assert any(k.endswith("-state/model.safetensors") or "-state" in k for k in before), before
    argv = lora_argv(assets, out, "style", 2, "--network_dim", "8")
    done = run(argv, policy_file(tmp))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "holds another run" in done.stderr and "starts fresh" in done.stderr, done.stderr[-2000:]
    assert everything(out, first) == before, "the first run's files changed"
    runs = sorted(p.name for p in out.iterdir() if p.name.startswith(".trainsup"))
    assert runs == [".trainsup", ".trainsup-style"], runs
    events = read_events(out / ".trainsup-style")
    starts = [e for e in events if e["event"] == "attempt_start"]
    assert starts[0]["resume_from"] is None and starts[0]["resume_step"] == 0, starts
    assert not [e for e in events if e["event"] in ("state_set_aside", "save_hidden")
                and Path(e["dir"]).name.startswith(first)], "the first run's saves were moved"
    # Not mixed: the weights equal a bare run of the second command alone.
    bare_out = tmp / "bare"
    bare = run_plain(lora_argv(assets, bare_out, "style", 2, "--network_dim", "8"))
    assert bare.returncode == 0, bare.stderr[-2000:]
    assert_same_weights(out / "style.safetensors", bare_out / "style.safetensors")


def test_a_second_run_after_a_give_up_starts_fresh_and_leaves_the_first_alone(
        assets: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out-shared"
    gave_up = run(lora_argv(assets, out, "alpha", 1), policy_file(tmp_path, "restart:\n  max: 0\n"),
                  env=clean_env(TRAINSUP_DEMO_SIMULATE="cuda_oom@10"))
    assert gave_up.returncode == 3, gave_up.stderr[-2000:]
    second_run_is_its_own(assets, out, tmp_path, "alpha")


def test_a_second_run_after_ctrl_c_starts_fresh_and_leaves_the_first_alone(
        assets: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out-shared"
    argv = lora_argv(assets, out, "faces", 1)
    proc = subprocess.Popen(trainsup_cmd("run", "--quiet", "--policy", str(policy_file(tmp_path)), "--", *argv),
                            cwd=ROOT, env=clean_env(TRAINSUP_DEMO_STEP_SECONDS="0.3"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: any(e["event"] == "state_saved" and e["step"] >= 4
                               for e in read_events(out / ".trainsup")), timeout=120, what="a state of faces")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    second_run_is_its_own(assets, out, tmp_path, "faces")


def test_the_same_command_after_it_finished_trains_nothing(assets: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = lora_argv(assets, out, "cat", 3)
    policy = policy_file(tmp_path)
    first = run(argv, policy)
    assert first.returncode == 0, first.stderr[-2000:]
    before = digest_tree(out)
    logs = sorted(p.name for p in (out / ".trainsup").glob("attempt-*.log"))
    again = run(argv, policy)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "this run finished" in again.stderr and str(out / "cat.safetensors") in again.stderr, again.stderr
    assert "--fresh" in again.stderr
    assert digest_tree(out) == before
    assert sorted(p.name for p in (out / ".trainsup").glob("attempt-*.log")) == logs
    # --fresh: a new run of its own, which never writes over the finished run's files: refused here.
    fresh = run(argv, policy, "--fresh")
    assert fresh.returncode == 2, fresh.stderr
    assert "trainsup: error:" in fresh.stderr and "cat" in fresh.stderr and "Traceback" not in fresh.stderr
    assert digest_tree(out) == before
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".trainsup")) == [".trainsup"]


def test_resume_with_nothing_of_this_run_is_an_error(assets: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run(lora_argv(assets, out, "dog", 4), policy_file(tmp_path), "--resume")
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("trainsup: error: --resume: nothing of this run"), lines
    assert not out.exists()


def test_a_new_run_never_trains_over_another_runs_weights(assets: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    policy = policy_file(tmp_path)
    first = run(lora_argv(assets, out, "cat", 3), policy)
    assert first.returncode == 0, first.stderr[-2000:]
    before = digest_tree(out)
    # The same output name with another network dim: another run, whose saves would land on cat's.
    other = run(lora_argv(assets, out, "cat", 3, "--network_dim", "8"), policy)
    assert other.returncode == 2, other.stderr
    assert "already lie under this run's output names" in other.stderr, other.stderr
    assert digest_tree(out) == before
