"""Prompt-file validation and the stale-cache decision (pure file logic, real files in tmp)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from trainsup.adapters.kohya.caches import CacheManifest, Subset, set_aside, stale_caches
from trainsup.adapters.kohya.prompts import PromptError, parse_prompt_file


def test_kohya_txt_prompts_with_options_and_comments(tmp_path: Path) -> None:
    p = tmp_path / "p.txt"
    p.write_text("# comment\n\na cat --n ugly, blurry --w 512 --h 768 --d 42 --s 20 --l 7.5\na dog\n")
    assert parse_prompt_file(p) == ["a cat", "a dog"]


@pytest.mark.parametrize("text, line, reason", [
    ("ok --w 16\nbad --w sixteen\n", 2, "--w expects an integer"),
    ("ok --l seven\n", 1, "--l expects a number"),
    ("ok --zz 3\n", 1, "unknown option --zz"),
    ("# only comments\n", None, "no prompt in the file"),
])
def test_invalid_txt_prompts_name_the_line(tmp_path: Path, text: str, line: int | None, reason: str) -> None:
    p = tmp_path / "p.txt"
    p.write_text(text)
    with pytest.raises(PromptError) as err:
        parse_prompt_file(p)
    assert err.value.line == line and reason in err.value.reason


def test_toml_and_json_prompts(tmp_path: Path) -> None:
    t = tmp_path / "p.toml"
    t.write_text('[prompt]\nwidth = 512\n[[prompt.subset]]\nprompt = "a cat"\n[[prompt.subset]]\nprompt = "a dog"\n')
    assert parse_prompt_file(t) == ["a cat", "a dog"]
    t.write_text('[prompt]\nwidth = 512\n\n[[prompt.subset\n')
    with pytest.raises(PromptError) as err:
        parse_prompt_file(t)
    assert err.value.line == 4
    j = tmp_path / "p.json"
    j.write_text('[{"prompt": "a cat", "width": 512}]')
    assert parse_prompt_file(j) == ["a cat"]
    j.write_text('[\n{"prompt": "a cat",}\n]')
    with pytest.raises(PromptError) as err:
        parse_prompt_file(j)
    assert err.value.line == 2


def make_subset(root: Path) -> Subset:
    sub = root / "1_demo"
    sub.mkdir(parents=True)
    for i in range(3):
        (sub / f"img{i}.png").write_bytes(b"png")
        (sub / f"img{i}.txt").write_text(f"caption {i}")
        (sub / f"img{i}_flux_te.npz").write_bytes(b"te")
        (sub / f"img{i}_0016x0016_flux.npz").write_bytes(b"latent")
    return Subset(root, sub, None)


def test_only_the_edited_captions_cache_is_stale(tmp_path: Path) -> None:
    subset = make_subset(tmp_path / "data")
    manifest = CacheManifest(tmp_path / "caches.json")
    settings = {"resolution": "16"}
    assert stale_caches([subset], manifest, settings, time.time()) == []  # first look: baseline
    manifest.save()
    (subset.image_dir / "img1.txt").write_text("an edited caption")
    again = CacheManifest.load(tmp_path / "caches.json")
    stale = stale_caches([subset], again, settings, time.time())
    assert [p.name for p, _ in stale] == ["img1_flux_te.npz"]
    moved = set_aside(stale, tmp_path / "run")
    assert moved == [str(subset.image_dir / "img1_flux_te.npz")]
    assert not (subset.image_dir / "img1_flux_te.npz").exists()
    assert len(list((tmp_path / "run" / "invalidated").glob("*/1_demo/img1_flux_te.npz"))) == 1
    assert (subset.image_dir / "img1.txt").exists() and (subset.image_dir / "img0_flux_te.npz").exists()


def test_a_cache_built_during_the_last_attempt_is_judged_by_the_caption_at_that_launch(tmp_path: Path) -> None:
    subset = make_subset(tmp_path / "data")
    cache = subset.image_dir / "img2_flux_te.npz"
    cache.unlink()
    manifest = CacheManifest(tmp_path / "caches.json")
    launch = time.time() - 5
    stale_caches([subset], manifest, {}, launch)  # launch 1: img2 has no cache yet
    cache.write_bytes(b"te")  # the trainer builds it during that attempt...
    os.utime(cache, (launch + 1, launch + 1))
    (subset.image_dir / "img2.txt").write_text("edited after the cache was built")  # ...then an edit
    stale = stale_caches([subset], manifest, {}, time.time())
    assert [p.name for p, _ in stale] == ["img2_flux_te.npz"]


def test_changed_resolution_makes_latents_stale_but_not_te_caches(tmp_path: Path) -> None:
    subset = make_subset(tmp_path / "data")
    manifest = CacheManifest(tmp_path / "caches.json")
    stale_caches([subset], manifest, {"resolution": "16"}, time.time())
    stale = stale_caches([subset], manifest, {"resolution": "32"}, time.time())
    assert sorted(p.name for p, _ in stale) == [f"img{i}_0016x0016_flux.npz" for i in range(3)]


def test_an_edited_image_makes_only_its_latents_stale(tmp_path: Path) -> None:
    # sd-scripts checks a latent cache by its keys and shape only: an image edited in place (same size)
    # would train on the old picture's latents after a resume.
    subset = make_subset(tmp_path / "data")
    manifest = CacheManifest(tmp_path / "caches.json")
    launch = time.time() - 5
    stale_caches([subset], manifest, {"resolution": "16"}, launch)
    manifest.save()
    image = subset.image_dir / "img1.png"
    image.write_bytes(b"another picture")
    os.utime(image, (launch + 2, launch + 2))
    again = CacheManifest.load(tmp_path / "caches.json")
    stale = stale_caches([subset], again, {"resolution": "16"}, time.time())
    assert [p.name for p, _ in stale] == ["img1_0016x0016_flux.npz"]
    assert stale_caches([subset], again, {"resolution": "16"}, time.time()) == []  # rebuilt once, then current


def test_latents_built_during_the_last_attempt_are_judged_by_the_image_at_that_launch(tmp_path: Path) -> None:
    subset = make_subset(tmp_path / "data")
    cache = subset.image_dir / "img0_0016x0016_flux.npz"
    cache.unlink()
    manifest = CacheManifest(tmp_path / "caches.json")
    launch = time.time() - 5
    stale_caches([subset], manifest, {}, launch)  # launch 1: img0 has no latents yet
    cache.write_bytes(b"latent")  # the trainer caches them during that attempt...
    os.utime(cache, (launch + 1, launch + 1))
    image = subset.image_dir / "img0.png"
    image.write_bytes(b"edited after caching")  # ...then the image is replaced
    os.utime(image, (launch + 2, launch + 2))
    stale = stale_caches([subset], manifest, {}, time.time())
    assert [p.name for p, _ in stale] == ["img0_0016x0016_flux.npz"]
