"""Which adapter runs a command, and that supervising a command no adapter knows never changes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.contract.kit import launched
from trainsup.record.journal import Journal
from trainsup.record.ledger import Ledger
from trainsup.trainers.base import Setup, UsageError
from trainsup.trainers.registry import choose, families, open_run


@pytest.mark.parametrize(("argv", "family"), [
    ("accelerate launch --num_cpu_threads_per_process 1 train_network.py --output_dir o", "kohya"),
    ("python -m trainsup.demo.flux_train_network --output_dir o", "kohya"),
    ("python my_lora_script.py --pretrained_model_name_or_path m --output_dir o", "kohya"),  # kohya's flags
    ("python scripts/train.py --config-path cfg.json", "onetrainer"),  # OneTrainer: not kohya's
    ("python scripts/finetune.py --config-path cfg.json", "command"),
    ("python -c print(1)", "command"),
    ("./train.sh --epochs 3", "command"),
    ("accelerate launch", "kohya"),  # kohya's launcher without its script: a usage error there
])
def test_the_adapter_that_knows_the_command_wins(argv: str, family: str) -> None:
    assert choose(argv.split()).name == family


def test_every_built_in_adapter_is_registered_through_the_entry_point_group() -> None:
    assert {"kohya", "litgpt", "onetrainer", "command", "declarative"} <= set(families())


def test_a_named_adapter_wins_and_an_unknown_name_lists_the_known_ones() -> None:
    assert choose("python train_network.py".split(), "command").name == "command"
    assert choose(["x"], {"states": "out/*"}).name == "declarative"
    with pytest.raises(UsageError, match="unknown adapter 'nope'.*kohya"):
        choose(["x"], "nope")


def test_a_command_no_adapter_knows_is_launched_exactly_as_given_every_time(tmp_path: Path) -> None:
    argv = ("python", "scripts/finetune.py", "--config-path", "cfg.json")
    run = open_run(Setup(argv, tmp_path))
    journal = Journal(tmp_path)
    run.bind(tmp_path, Ledger(tmp_path / "ledger.json"), journal, lambda _m: None)
    assert launched(run, run.plan.copy(), 1, None, tmp_path) == list(argv)
    assert launched(run, run.plan.copy(), 2, None, tmp_path) == list(argv)  # no --seed, no --save_state
    assert run.states.newest() is None and run.states.final_written()
    journal.close()


def test_the_accelerate_launcher_without_a_script_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="training script"):
        open_run(Setup(("accelerate", "launch"), tmp_path))


def test_the_command_adapter_puts_its_run_dir_beside_the_commands_output(tmp_path: Path) -> None:
    run = open_run(Setup(("python", "train.py", "--out_dir=runs/a"), tmp_path))
    assert run.default_run_dir(tmp_path) == tmp_path / "runs" / "a" / ".trainsup"
    bare = open_run(Setup(("python", "train.py"), tmp_path))
    assert bare.default_run_dir(tmp_path) == tmp_path / ".trainsup"
