"""musubi-tuner's caches (issue 31): doctor finds a dataset musubi could not train on, a latent cache
without its text-encoder cache, media without caches or caches without media, and a caption or image
edited since its cache was made, each with the caching commands; ``--fp8_base`` alone and
``--blocks_to_swap`` on a CPU-only torch; and a run says once that an edited caption or image is not
trained on until re-cached, never touching the user's caches. The caches are built here as musubi
writes them (names, safetensors with ``caption1``), without musubi."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from tests.contract.kit import launched
from trainsup.adapters.musubi.adapter import MusubiRun
from trainsup.adapters.musubi.caches import CACHING, caching_commands, datasets, inspect
from trainsup.adapters.musubi.profile import SCRIPTS
from trainsup.record.journal import Journal, read_events
from trainsup.record.ledger import Ledger
from trainsup.trainers.base import DoctorFacts, Finding, Setup, rung_applies
from trainsup.trainers.cmdline import TrainerCommand

ITEMS = ("img00", "img01", "img02")
SNAPSHOT = Path(__file__).resolve().parents[3] / "shared" / "realmusubi" / "musubi-tuner" / "src" / "musubi_tuner"


def _bed(tmp: Path, items: tuple[str, ...] = ITEMS, te: tuple[str, ...] = ITEMS,
         latents: tuple[str, ...] = ITEMS) -> Path:
    """A Wan dataset: images with captions in img/, their caches in cache/, as musubi's scripts write them."""
    img, cache = tmp / "img", tmp / "cache"
    img.mkdir()
    cache.mkdir()
    for item in items:
        (img / f"{item}.png").write_bytes(b"png")
        (img / f"{item}.txt").write_text(f"a photo of {item}\n")
        os.utime(img / f"{item}.png", (1_000_000, 1_000_000))
    for item in latents:
        save_file({"latents_1x8x8_bfloat16": np.zeros((16, 1, 8, 8), np.float32)},
                  str(cache / f"{item}_0064x0064_wan.safetensors"),
                  metadata={"architecture": "wan", "width": "64", "height": "64", "format_version": "1.0.1"})
    for item in te:
        save_file({"varlen_t5_bfloat16": np.zeros((3, 8), np.float32)}, str(cache / f"{item}_wan_te.safetensors"),
                  metadata={"architecture": "wan", "caption1": f"a photo of {item}", "format_version": "1.0.1"})
    toml = tmp / "dataset.toml"
    toml.write_text('[general]\nresolution = [64, 64]\ncaption_extension = ".txt"\nbatch_size = 1\n\n'
                    '[[datasets]]\nimage_directory = "img"\ncache_directory = "cache"\n')
    return toml


def _argv(tmp: Path, *extra: str) -> tuple[str, ...]:
    return ("accelerate", "launch", "src/musubi_tuner/wan_train_network.py", "--task", "t2v-1.3B", "--sdpa",
            "--dit", "dit.safetensors", "--dataset_config", str(tmp / "dataset.toml"), "--output_dir",
            str(tmp / "out"), "--output_name", "tiny", "--max_train_steps", "20", *extra)


def _doctor(tmp: Path, *extra: str, torch: str | None = None) -> list[Finding]:
    run = MusubiRun(Setup(_argv(tmp, *extra), tmp, as_given=True))
    if torch is not None:
        run.doctor_facts = DoctorFacts("python", {"torch": torch, "safetensors": "0.4.5", "accelerate": "1.0"})
    return run.doctor(dict(os.environ))


def _ids(findings: list[Finding], severity: str) -> list[str]:
    return [f.id for f in findings if f.severity == severity]


def test_nothing_cached_is_a_blocker_whose_fix_is_both_caching_commands(tmp_path: Path) -> None:
    _bed(tmp_path, te=(), latents=())
    findings = _doctor(tmp_path, "--vae", "models/Wan2.1_VAE.pth")
    blocker = next(f for f in findings if f.id == "missing_cache")
    assert blocker.severity == "blocker" and "No training items found" in blocker.message
    assert "src/musubi_tuner/wan_cache_latents.py --dataset_config" in blocker.fix
    assert "--vae models/Wan2.1_VAE.pth" in blocker.fix  # the training command's own VAE
    assert "src/musubi_tuner/wan_cache_text_encoder_outputs.py" in blocker.fix and "--t5 T5" in blocker.fix


def test_latent_caches_without_any_text_encoder_cache_are_nothing_to_train_on(tmp_path: Path) -> None:
    _bed(tmp_path, te=())
    findings = _doctor(tmp_path)
    assert "missing_cache" in _ids(findings, "blocker")
    assert "3 latent cache(s) without their text-encoder cache" in next(
        f.message for f in findings if f.id == "missing_cache")


def test_a_complete_fresh_cache_says_nothing(tmp_path: Path) -> None:
    _bed(tmp_path)
    cache_ids = {"missing_cache", "missing_te_cache", "uncached_media", "orphan_cache", "stale_cache"}
    assert not cache_ids & {f.id for f in _doctor(tmp_path)}


def test_an_item_without_its_text_encoder_cache_is_a_warning_naming_it(tmp_path: Path) -> None:
    _bed(tmp_path, te=("img00", "img02"))
    findings = _doctor(tmp_path, "--t5", "t5.safetensors")
    warning = next(f for f in findings if f.id == "missing_te_cache")
    assert warning.severity == "warning" and "img01" in warning.message and "img00" not in warning.message
    assert "wan_cache_text_encoder_outputs.py" in warning.fix and "--t5 t5.safetensors" in warning.fix
    assert not _ids(findings, "blocker")


def test_an_edited_caption_is_stale_against_its_text_encoder_caches_caption1(tmp_path: Path) -> None:
    _bed(tmp_path)
    (tmp_path / "img" / "img02.txt").write_text("a drawing of a cube\n")
    stale = [f for f in _doctor(tmp_path) if f.id == "stale_cache"]
    assert len(stale) == 1 and stale[0].severity == "warning"
    assert "img02" in stale[0].message and "caption" in stale[0].message
    assert "wan_cache_text_encoder_outputs.py" in stale[0].fix
    (tmp_path / "img" / "img02.txt").write_text("  a photo of img02  \n")  # musubi strips it: the same
    assert not [f for f in _doctor(tmp_path) if f.id == "stale_cache"]


def test_an_image_newer_than_its_latent_cache_is_stale(tmp_path: Path) -> None:
    _bed(tmp_path)
    os.utime(tmp_path / "img" / "img01.png")  # now: after the cache was made
    stale = [f for f in _doctor(tmp_path) if f.id == "stale_cache"]
    assert len(stale) == 1 and "img01" in stale[0].message and "wan_cache_latents.py" in stale[0].fix


def test_media_without_caches_and_caches_without_media_are_warnings(tmp_path: Path) -> None:
    _bed(tmp_path, latents=("img00", "img01"), te=("img00", "img01"))
    (tmp_path / "img" / "img00.png").unlink()
    findings = _doctor(tmp_path)
    assert "img02" in next(f.message for f in findings if f.id == "uncached_media")
    orphan = next(f for f in findings if f.id == "orphan_cache")
    assert "img00" in orphan.message and "still trains on" in orphan.message


def test_fp8_base_alone_and_block_swap_are_blocked_on_a_cpu_only_torch(tmp_path: Path) -> None:
    _bed(tmp_path)
    cpu = _doctor(tmp_path, "--fp8_base", "--blocks_to_swap", "10", torch="2.7.1+cpu")
    assert {"fp8_on_cpu", "block_swap_on_cpu"} <= set(_ids(cpu, "blocker"))
    scaled = _doctor(tmp_path, "--fp8_base", "--fp8_scaled", torch="2.7.1+cpu")  # runs on the CPU bed
    assert "fp8_on_cpu" not in {f.id for f in scaled}
    cuda = _doctor(tmp_path, "--fp8_base", "--blocks_to_swap", "10", torch="2.7.1+cu128")
    assert not {"fp8_on_cpu", "block_swap_on_cpu"} & {f.id for f in cuda}
    assert not {"fp8_on_cpu", "block_swap_on_cpu"} & {f.id for f in _doctor(tmp_path, "--fp8_base")}  # unknown


def test_caching_commands_follow_the_scripts_form_and_models() -> None:
    module = TrainerCommand.parse("python -m musubi_tuner.qwen_image_train_network --dit d --vae v "
                                  "--text_encoder te --dataset_config ds.toml".split())
    latents, text = caching_commands(module, "ds.toml") or []
    assert latents == "python -m musubi_tuner.qwen_image_cache_latents --dataset_config ds.toml --vae v"
    assert text == "python -m musubi_tuner.qwen_image_cache_text_encoder_outputs --dataset_config ds.toml " \
                   "--text_encoder te"
    hv = TrainerCommand.parse("accelerate launch hv_train_network.py --dit d".split())
    assert caching_commands(hv, "d.toml") == [
        "python cache_latents.py --dataset_config d.toml --vae VAE",
        ("python cache_text_encoder_outputs.py --dataset_config d.toml --text_encoder1 TEXT_ENCODER1 "
         "--text_encoder2 TEXT_ENCODER2")]


def test_every_training_script_has_its_caching_scripts() -> None:
    assert set(CACHING) == set(SCRIPTS)
    if SNAPSHOT.is_dir():  # and the snapshot has them (CI copies without ../shared check the names only)
        for caching in CACHING.values():
            assert (SNAPSHOT / f"{caching.latents}.py").is_file(), caching.latents
            assert (SNAPSHOT / f"{caching.text}.py").is_file(), caching.text


def test_the_caching_commands_run_under_the_venv_of_the_trainers_accelerate(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    for name in ("accelerate", "python"):
        (tmp_path / "bin" / name).write_text("#!/bin/sh\n")
    command = TrainerCommand.parse([str(tmp_path / "bin" / "accelerate"), "launch",
                                    "src/musubi_tuner/wan_train_network.py", "--vae", "v.pth", "--t5", "t5.st"])
    latents, text = caching_commands(command, "d.toml") or []
    assert latents == f"{tmp_path}/bin/python src/musubi_tuner/wan_cache_latents.py --dataset_config d.toml --vae v.pth"
    assert text.startswith(f"{tmp_path}/bin/python src/musubi_tuner/wan_cache_text_encoder_outputs.py")


def test_a_video_datasets_caches_pair_by_item(tmp_path: Path) -> None:
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "clip_a.mp4").write_bytes(b"mp4")
    save_file({"x": np.zeros(1, np.float32)}, str(tmp_path / "v" / "clip_a_00000-025_0640x0360_hv.safetensors"))
    save_file({"x": np.zeros(1, np.float32)}, str(tmp_path / "v" / "clip_a_hv_te.safetensors"))
    [ds] = datasets({"datasets": [{"video_directory": "v", "caption_extension": ".txt"}]}, tmp_path)
    report = inspect(ds, ("hv",))
    assert report.trainable == 1 and not report.no_te and not report.uncached and not report.orphans


def _bound(tmp: Path, said: list[str], vae: bool = True) -> tuple[MusubiRun, Path]:
    run = MusubiRun(Setup(_argv(tmp, *(("--vae", "vae.pth") if vae else ()), "--t5", "t5.safetensors"), tmp))
    run_dir = tmp / "out" / ".trainsup"
    run_dir.mkdir(parents=True)
    run.bind(run_dir, Ledger.load(run_dir / "ledger.json"), Journal(run_dir), said.append)
    return run, run_dir


def test_an_edited_caption_or_image_during_a_run_is_said_once_with_the_caching_commands(tmp_path: Path) -> None:
    _bed(tmp_path)
    said: list[str] = []
    run, run_dir = _bound(tmp_path, said)
    cache = tmp_path / "cache"
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in cache.iterdir()}
    launched(run, run.plan.copy(), 1, None, run_dir)
    caption, image = (tmp_path / "img" / "img01.txt").resolve(), (tmp_path / "img" / "img02.png").resolve()
    caption.write_text("a new caption\n")
    assert run.inputs.owns(caption) and run.inputs.owns(image)
    assert run.inputs.on_change(caption, "modified", run.plan) == "none"
    assert run.inputs.on_change(image, "modified", run.plan) == "none"
    assert run.inputs.on_change(caption, "modified", run.plan) == "none"
    warned = [s for s in said if "musubi-tuner trains only on its caches" in s]
    assert len(warned) == 1 and "img01.txt" in warned[0]
    assert "wan_cache_latents.py --dataset_config" in warned[0] and "--vae vae.pth" in warned[0]
    assert "wan_cache_text_encoder_outputs.py" in warned[0] and "--t5 t5.safetensors" in warned[0]
    events = read_events(run_dir)
    assert [e["path"] for e in events if e["event"] == "warning"] == [str(caption), str(image)]
    assert not [e for e in events if e["event"] in ("change_scheduled", "change_applied")]  # never "applied"
    launched(run, run.plan.copy(), 2, None, run_dir)
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in cache.iterdir()} == before
    assert not (run_dir / "invalidated").exists()


def test_a_dataset_toml_edit_of_what_only_caching_reads_is_rejected_batch_size_applies(tmp_path: Path) -> None:
    """Without ``--vae`` trainsup cannot make the latents again: a resolution edit is refused."""
    toml = _bed(tmp_path)
    said: list[str] = []
    run, run_dir = _bound(tmp_path, said, vae=False)
    launched(run, run.plan.copy(), 1, None, run_dir)
    toml.write_text(toml.read_text().replace("resolution = [64, 64]", "resolution = [128, 128]"))
    assert run.inputs.on_change(toml.resolve(), "modified", run.plan) == "none"
    rejected = [e for e in read_events(run_dir) if e["event"] == "change_rejected"]
    assert len(rejected) == 1 and "resolution" in rejected[0]["reason"]
    assert "wan_cache_latents.py" in rejected[0]["reason"]
    assert any("is not applied" in s and "resolution" in s for s in said)
    toml.write_text(toml.read_text().replace("resolution = [128, 128]", "resolution = [64, 64]")
                    .replace("batch_size = 1", "batch_size = 2"))
    assert run.inputs.on_change(toml.resolve(), "modified", run.plan) == "at_checkpoint"
    argv = launched(run, run.plan.copy(), 2, None, run_dir)
    assert "batch_size = 2" in Path(argv[argv.index("--dataset_config") + 1]).read_text()


def _user_cache(tmp: Path) -> dict[str, tuple[int, bytes]]:
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (tmp / "cache").iterdir()}


def test_a_resolution_edit_is_applied_with_the_latents_made_again_in_the_run_dir(tmp_path: Path) -> None:
    """With ``--vae`` in the command, a resolution edit is accepted: the next launch's derived dataset TOML
    points at caches in the run dir, the text-encoder caches copied there, and musubi's latent caching
    runs first on that TOML; the user's cache directory is never written."""
    toml = _bed(tmp_path)
    said: list[str] = []
    run, run_dir = _bound(tmp_path, said)
    first = run.launch(run.plan.copy(), 1, None, run_dir)
    assert first.before == ()  # the user's caches match the dataset TOML: nothing to make
    before = _user_cache(tmp_path)
    toml.write_text(toml.read_text().replace("resolution = [64, 64]", "resolution = [48, 48]"))
    assert run.inputs.on_change(toml.resolve(), "modified", run.plan) == "at_checkpoint"
    assert any("made again" in s for s in said)
    second = run.launch(run.plan.copy(), 2, None, run_dir)
    derived = Path(second.argv[second.argv.index("--dataset_config") + 1])
    doc = tomllib.loads(derived.read_text())
    cache_dir = Path(doc["datasets"][0]["cache_directory"])
    assert doc["general"]["resolution"] == [48, 48] and cache_dir.is_relative_to(run_dir / "caches")
    assert sorted(p.name for p in cache_dir.iterdir()) == [f"{i}_wan_te.safetensors" for i in ITEMS]
    (step,) = second.before
    assert step.argv[1:] == ("src/musubi_tuner/wan_cache_latents.py", "--dataset_config", str(derived),
                             "--vae", "vae.pth")
    assert "48x48" in step.says
    # once musubi wrote them (complete files; named by the image's own size, as on the real bed), a later
    # launch with the same settings runs nothing first
    for item in ITEMS:
        save_file({"latents_1x6x6_bfloat16": np.zeros((16, 1, 6, 6), np.float32)},
                  str(cache_dir / f"{item}_0064x0064_wan.safetensors"))
    assert run.launch(run.plan.copy(), 3, None, run_dir).before == ()
    cut = cache_dir / "img01_0064x0064_wan.safetensors"
    cut.write_bytes(cut.read_bytes()[:-100])  # a cache cut by a kill during the caching
    assert len(run.launch(run.plan.copy(), 4, None, run_dir).before) == 1
    assert _user_cache(tmp_path) == before


def test_the_memory_ladders_last_lever_lowers_the_resolution_with_the_caches_made_again(tmp_path: Path) -> None:
    toml = _bed(tmp_path)
    toml.write_text(toml.read_text().replace("resolution = [64, 64]", "resolution = [960, 544]"))
    said: list[str] = []
    run, run_dir = _bound(tmp_path, said)
    rung = next(r for r in run.ladder("cuda_oom") if r.actions[0].kind == "lower_resolution")
    assert rung_applies(run, run.plan, rung)
    plan = run.plan.copy()
    assert "resolution [720, 400]" in (run.apply(plan, rung.actions[0]) or "")
    launch = run.launch(plan, 2, None, run_dir)
    derived = Path(launch.argv[launch.argv.index("--dataset_config") + 1])
    assert tomllib.loads(derived.read_text())["general"]["resolution"] == [720, 400]
    assert len(launch.before) == 1 and "720x400" in launch.before[0].says
    assert "resolution = [960, 544]" in toml.read_text()  # the user's file as it was
    # once more it goes down (a quarter of the first each time); it never lowers a side below 256 px
    assert "[528, 304]" in (run.apply(plan, rung.actions[0]) or "")
    assert run.apply(plan, rung.actions[0]) is None and not rung_applies(run, plan, rung)
    # without the VAE in the command trainsup cannot make the latents: the rung means nothing there
    (tmp_path / "novae").mkdir()
    novae = _bed(tmp_path / "novae")
    novae.write_text(novae.read_text().replace("resolution = [64, 64]", "resolution = [960, 544]"))
    other, _ = _bound(tmp_path / "novae", said, vae=False)
    assert not rung_applies(other, other.plan, rung)
