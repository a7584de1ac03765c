"""KohyaInputs: what an edit of the config, dataset config, prompt or policy file does to the run."""

from __future__ import annotations

import json
from pathlib import Path

from trainsup.adapters.kohya.inputs import KohyaInputs
from trainsup.adapters.kohya.prepare import prepare
from trainsup.record.journal import Journal
from trainsup.run.policy import Policy


def setup(tmp_path: Path, script: str = "flux_train_network.py", extra: str = ""):
    cfg = tmp_path / "cfg.toml"
    cfg.write_text('[network]\nnetwork_dim = 4\n[training]\nlearning_rate = 1e-4\nmixed_precision = "bf16"\n')
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a cat\n")
    argv = (f"python {script} --config_file {cfg} --output_dir {tmp_path / 'out'} --sample_prompts {prompts} "
            f"--max_train_steps 10 {extra}").split()
    prepared = prepare(argv, tmp_path, Policy().trainer_settings())
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    journal = Journal(run_dir)
    said: list[str] = []
    live = KohyaInputs(prepared.plan, tmp_path, run_dir, Policy().trainer_settings(), journal, said.append)
    launch = prepared.plan.copy()
    live.before_launch(1, launch)
    return live, launch, cfg, prompts, run_dir, said


def events(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


def test_each_launch_gets_frozen_copies(tmp_path: Path) -> None:
    _live, launch, _cfg, _prompts, run_dir, _ = setup(tmp_path)
    snapshot = Path(launch.command.get("sample_prompts") or "")
    assert snapshot == run_dir / "prompts" / "attempt-1.txt" and snapshot.read_text() == "a cat\n"
    launch.write_derived_configs(run_dir, 1)
    assert Path(launch.command.get("config_file") or "").parent == run_dir / "derived"


def test_locked_config_keys_are_refused_and_the_old_config_kept(tmp_path: Path) -> None:
    live, _, cfg, _, run_dir, _said = setup(tmp_path)
    cfg.write_text('[network]\nnetwork_dim = 8\n[training]\nlearning_rate = 1e-4\nmixed_precision = "fp16"\n')
    assert live.on_change(cfg, "modified") == "none"
    rejected = [e for e in events(run_dir) if e["event"] == "change_rejected"][-1]
    assert "network_dim" in rejected["reason"] and "fp16" in rejected["reason"]
    assert live.config_doc is not None and live.config_doc["network"]["network_dim"] == 4


def test_other_config_changes_wait_for_the_next_checkpoint(tmp_path: Path) -> None:
    live, _, cfg, _, run_dir, _ = setup(tmp_path)
    cfg.write_text('[network]\nnetwork_dim = 4\n[training]\nlearning_rate = 5e-5\nmixed_precision = "bf16"\n')
    assert live.on_change(cfg, "modified") == "at_checkpoint"
    launch2 = live_launch(live)
    assert launch2.config_value("learning_rate") == 5e-5
    applied = [e for e in events(run_dir) if e["event"] == "change_applied"]
    assert applied == [{**applied[0], "path": str(cfg), "attempt": 2}]


def live_launch(live: KohyaInputs):
    from trainsup.adapters.kohya.plan import LaunchPlan
    from trainsup.trainers.cmdline import TrainerCommand

    launch = LaunchPlan(TrainerCommand.parse(["python", "flux_train_network.py"]))
    live.before_launch(2, launch)
    return launch


def test_invalid_toml_is_rejected_with_its_line(tmp_path: Path) -> None:
    live, _, cfg, _, run_dir, _ = setup(tmp_path)
    cfg.write_text('[network]\nnetwork_dim = 4\nlearning_rate = = 3\n')
    assert live.on_change(cfg, "modified") == "none"
    rejected = [e for e in events(run_dir) if e["event"] == "change_rejected"][-1]
    assert rejected["line"] == 3


def test_prompt_edit_is_swapped_live_where_the_trainer_reads_prompts_live(tmp_path: Path) -> None:
    live, launch, _, prompts, run_dir, _ = setup(tmp_path, script="train_network.py")
    prompts.write_text("a dog\n")
    assert live.on_change(prompts, "modified") == "none"
    assert Path(launch.command.get("sample_prompts") or "").read_text() == "a dog\n"
    assert [e["event"] for e in events(run_dir)][-1] == "change_applied"


def test_prompt_edit_under_te_caching_waits_for_a_checkpoint_and_a_deletion_only_warns(tmp_path: Path) -> None:
    live, launch, _, prompts, _run_dir, said = setup(tmp_path, extra="--cache_text_encoder_outputs")
    prompts.write_text("a dog\n")
    assert live.on_change(prompts, "modified") == "at_checkpoint"
    assert Path(launch.command.get("sample_prompts") or "").read_text() == "a cat\n"  # untouched until then
    prompts.unlink()
    assert live.on_change(prompts, "deleted") == "none"
    assert live.on_change(prompts, "deleted") == "none"
    assert sum("was deleted" in s for s in said) == 1  # warned once
