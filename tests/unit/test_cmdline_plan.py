"""The command model, the kohya profile and remedy actions applied to launch plans."""

import tomllib
from pathlib import Path

import pytest

from trainsup.adapters.kohya import tomlio
from trainsup.adapters.kohya.plan import LaunchPlan, apply_action
from trainsup.adapters.kohya.profile import parse_state_name, script_info
from trainsup.faults.remedies import Action
from trainsup.trainers.cmdline import TrainerCommand


def test_parse_finds_the_script_behind_launchers() -> None:
    c = TrainerCommand.parse("accelerate launch --num_processes 1 sd-scripts/flux_train_network.py "
                             "--network_args a=1 b=2 --fp8_base --lr=1e-4".split())
    assert c.script == "flux_train_network"
    assert c.launcher[-1] == "sd-scripts/flux_train_network.py"
    assert c.get("network_args") == "b=2" and c.has("fp8_base") and c.get("lr") == "1e-4"
    demo = TrainerCommand.parse("python -m trainsup.demo.launch -m trainsup.demo.train_network --x 1".split())
    assert demo.script == "train_network"
    with pytest.raises(ValueError, match="cannot find the training script"):
        TrainerCommand.parse(["echo", "--x"])


def test_set_and_remove_keep_other_flags_in_order() -> None:
    c = TrainerCommand.parse("python t.py --a 1 --resume old --b".split())
    c.set("resume", "new")
    c.set("seed", "3")
    assert c.remove("b") and not c.remove("b")
    assert c.argv() == "python t.py --a 1 --resume new --seed 3".split()


def _plan(argv: str, config: Path | None = None) -> LaunchPlan:
    doc = tomlio.read_toml(config) if config else None
    return LaunchPlan(TrainerCommand.parse(argv.split()), {}, set(), config, doc)


def test_flags_that_do_not_exist_in_the_script_are_never_added() -> None:
    sd = _plan("python train_network.py --cache_latents")
    assert apply_action(sd, Action("add_flag", "cache_text_encoder_outputs")) is None
    assert apply_action(sd, Action("add_flag", "lowvram")) is None
    flux = _plan("python flux_train_network.py")
    assert apply_action(flux, Action("add_flag", "blocks_to_swap", "8")) is not None
    assert flux.command.get("blocks_to_swap") == "8"
    assert script_info("train_network").has_flag("blocks_to_swap") is False


def test_fp8_base_brings_mixed_precision_along() -> None:
    plan = _plan("python flux_train_network.py --mixed_precision no")
    assert "mixed_precision bf16" in (apply_action(plan, Action("add_flag", "fp8_base")) or "")
    assert plan.command.has("fp8_base") and plan.command.get("mixed_precision") == "bf16"
    assert apply_action(plan, Action("add_flag", "fp8_base")) is None  # already there


def test_removing_a_flag_set_in_the_config_file_writes_a_derived_toml(tmp_path: Path) -> None:
    user = tmp_path / "cfg.toml"
    original = '[model]\ncache_latents = true\nnetwork_dim = 4\n[saving]\ncache_latents_to_disk = true\n'
    user.write_text(original)
    plan = _plan(f"python train_network.py --config_file {user}", user)
    assert "derived copy" in (apply_action(plan, Action("remove_flag", "cache_latents")) or "")
    assert apply_action(plan, Action("remove_flag", "cache_latents_to_disk")) is not None
    plan.write_derived_configs(tmp_path / "run", 2)
    derived = Path(plan.command.get("config_file") or "")
    assert derived.parent == tmp_path / "run" / "derived"
    assert tomllib.loads(derived.read_text()) == {"model": {"network_dim": 4}, "saving": {}}
    assert user.read_text() == original  # never modified


def test_halve_batch_and_lower_workers() -> None:
    plan = _plan("python train_network.py --train_batch_size 4 --max_data_loader_n_workers 2")
    apply_action(plan, Action("halve_batch"))
    assert plan.command.get("train_batch_size") == "2"
    assert plan.command.get("gradient_accumulation_steps") == "2"
    apply_action(plan, Action("lower_workers", value="0"))
    assert plan.command.get("max_data_loader_n_workers") == "0"
    assert apply_action(plan, Action("lower_workers", value="0")) is None


def test_state_names() -> None:
    assert parse_state_name("lora-step00000010-state") == ("lora", "step", 10)
    assert parse_state_name("lora-000003-state") == ("lora", "epoch", 3)
    assert parse_state_name("lora-state") == ("lora", "final", None)
    assert parse_state_name("lora.safetensors") is None


def test_a_dataset_configs_keys_are_removed_and_its_batch_halved_in_a_derived_copy(tmp_path: Path) -> None:
    user = tmp_path / "dataset.toml"
    original = ('# my dataset\n[general]\nshuffle_caption = true  # keep tags shuffled\ncaption_extension = ".txt"\n\n'
                '[[datasets]]\nresolution = 512\nbatch_size = 4\n\n  [[datasets.subsets]]\n  image_dir = "/img/a"\n'
                '  shuffle_caption = false\n\n[[datasets]]\nbatch_size = 1\n'
                '  [[datasets.subsets]]\n  image_dir = "/img/b"\n')
    user.write_text(original)
    plan = _plan(f"python train_network.py --dataset_config {user} --train_batch_size 1")
    plan.user_dataset, plan.dataset_doc = user, tomlio.read_toml(user)
    assert "derived copy" in (apply_action(plan, Action("remove_flag", "shuffle_caption")) or "")
    # --train_batch_size is 1 already, but the first dataset's own batch_size (4) is what kohya uses.
    assert "batch_size halved" in (apply_action(plan, Action("halve_batch")) or "")
    plan.write_derived_configs(tmp_path / "run", 3)
    derived = Path(plan.command.get("dataset_config") or "")
    assert derived == tmp_path / "run" / "derived" / "attempt-3.dataset.toml"
    text = derived.read_text()
    assert "# my dataset" in text and "shuffle_caption" not in text  # comments kept, the key gone everywhere
    assert tomllib.loads(text) == {"general": {"caption_extension": ".txt"}, "datasets": [
        {"resolution": 512, "batch_size": 2, "subsets": [{"image_dir": "/img/a"}]},
        {"batch_size": 1, "subsets": [{"image_dir": "/img/b"}]}]}
    assert user.read_text() == original  # never modified
    apply_action(plan, Action("halve_batch"))
    assert apply_action(plan, Action("halve_batch")) is None  # every batch is 1 now
