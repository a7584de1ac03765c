"""A kohya dataset config ([general], [[datasets]], [[datasets.subsets]]) under `trainsup run`, and a
remedy that must edit the user's config files through derived copies."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.e2e.demo_harness import assert_same_weights, demo_argv, run_plain, supervise


def with_dataset_config(argv: list[str], dataset: Path) -> list[str]:
    at = argv.index("--train_data_dir")
    return [*argv[:at], "--dataset_config", str(dataset), *argv[at + 2:]]


def test_latent_caching_refused_by_the_dataset_is_dropped_from_a_derived_config_copy(
        assets: dict[str, Path], tmp_path: Path) -> None:
    subset = assets["subset"]
    repeats = subset.name.split("_")[0]
    dataset = tmp_path / "dataset.toml"
    dataset.write_text(f'# my data\n[general]\nrandom_crop = true\ncaption_extension = ".txt"\n\n[[datasets]]\n'
                       f'batch_size = 2\n\n  [[datasets.subsets]]\n  image_dir = "{subset}"  # the folder\n'
                       f"  num_repeats = {repeats}\n", encoding="utf-8")
    config = tmp_path / "config.toml"
    config.write_text("[speed]\ncache_latents = true  # saves VAE time\n", encoding="utf-8")
    users = {p: p.read_bytes() for p in (dataset, config)}
    ref = tmp_path / "reference"
    r = run_plain(with_dataset_config(demo_argv("train_network", assets, ref), dataset))
    assert r.returncode == 0 and "model saved." in r.stderr, r.stderr[-3000:]
    out = tmp_path / "out"
    argv = with_dataset_config(demo_argv("train_network", assets, out, "--config_file", str(config)), dataset)
    run = supervise(argv, out, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    fault = run.of("fault")[0]
    assert fault["class"] == "flag_conflict" and "when caching latents" in fault["evidence"]
    assert any(str(config) in a and "--cache_latents" in a for a in run.of("remedy")[0]["actions"])
    argv2 = run.of("attempt_start")[-1]["argv"]
    derived = Path(argv2[argv2.index("--config_file") + 1])
    derived_dataset = Path(argv2[argv2.index("--dataset_config") + 1])
    assert derived.parent == derived_dataset.parent == run.run_dir / "derived"
    assert tomllib.loads(derived.read_text()) == {"speed": {}}
    assert derived_dataset.read_text().endswith(dataset.read_text())  # comments and all, after trainsup's header
    assert {p: p.read_bytes() for p in (dataset, config)} == users
    assert_same_weights(out / "lora.safetensors", ref / "lora.safetensors")
