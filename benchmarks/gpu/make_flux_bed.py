#!/usr/bin/env python3
"""Builds a random-weight Flux.1-dev bed for sd-scripts' ``flux_train_network.py`` (benchmarks/gpu only).

Run it with the trainer's own interpreter (it imports the sd-scripts snapshot given by --sd-scripts and
that snapshot's transformers): the layouts are not copied here but read from the snapshot's own model
classes, built on the meta device, so every key and shape is the one its loaders expect:

  flux1-dev.safetensors   ``flux_models.Flux`` of ``configs["dev"]`` in the BFL key layout (19 double and 38
                          single blocks: 11.9B parameters, 23.8 GB in bf16; --double/--single shrink the
                          depth for a rehearsal, which sd-scripts reads back from the keys)
  ae.safetensors          ``flux_models.AutoEncoder`` (16 latent channels)
  ae_missing_key.safetensors  the same less one decoder key: a loader with ``strict=False`` leaves that
                          parameter on the meta device (the meta-tensor seed's mechanism)
  clip_l.safetensors      the CLIP-L text model that ``flux_utils.load_clip_l`` builds
  t5xxl.safetensors       the T5-XXL encoder that ``flux_utils.load_t5xxl`` builds (4.8B parameters)
  tokenizers/             ``--tokenizer_cache_dir``: CLIP-L's BPE tables (copied from --clip-tokenizer) and a
                          small sentencepiece model saved as a T5TokenizerFast (ids stay below T5's 32128)
  data/                   four captioned PNGs, dataset.toml, prompts.txt (sample prompts)

Weights are random normals (std gain/sqrt(fan_in); norms 1, biases 0), seeded from each key's name, drawn
on --device and streamed tensor by tensor into the safetensors file, so no second copy of a 24 GB model is
ever held. Each file is skipped when it is already complete (its size matches its header), so a rerun on
the same machine costs seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import struct
import sys
import time
import zlib
from dataclasses import replace

import torch

DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float8_e4m3fn: "F8_E4M3"}


def log(msg: str) -> None:
    print(f"[make_flux_bed {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def layouts(sd_scripts: str, double: int | None, single: int | None) -> dict[str, dict[str, tuple[int, ...]]]:
    """Each file's key -> shape, read from the snapshot's own modules built on the meta device."""
    sys.path.insert(0, sd_scripts)
    from library import flux_models, flux_utils

    params = flux_models.configs["dev"].params
    if double is not None:
        params = replace(params, depth=double)
    if single is not None:
        params = replace(params, depth_single_blocks=single)
    with torch.device("meta"):
        flux = flux_models.Flux(params)
        ae = flux_models.AutoEncoder(flux_models.configs["dev"].ae_params)
    # the loaders themselves build CLIP-L and T5-XXL from their hard-coded configs; an empty state dict
    # leaves every parameter on the meta device, which is all the shapes need
    clip = flux_utils.load_clip_l(None, torch.bfloat16, "cpu", state_dict={})
    t5 = flux_utils.load_t5xxl(None, torch.bfloat16, "cpu", state_dict={})

    def shapes(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in module.state_dict().items()}

    return {"flux": shapes(flux), "ae": shapes(ae), "clip_l": shapes(clip), "t5xxl": shapes(t5)}


def init_std(key: str, shape: tuple[int, ...], gain: float) -> float | None:
    """None: a constant (1 for norm scales, 0 for biases); else the normal's std."""
    if len(shape) <= 1:
        return None
    if "embed" in key or "relative_attention_bias" in key:
        return 0.02
    fan_in = math.prod(shape[1:])
    return gain / math.sqrt(fan_in)


def constant(key: str) -> float:
    return 0.0 if key.endswith("bias") else 1.0


def write_safetensors(path: str, shapes: dict[str, tuple[int, ...]], dtype: torch.dtype, device: str,
                      gain: float) -> None:
    """Streams one tensor at a time into PATH (header first: the offsets follow from the shapes)."""
    keys = sorted(shapes)
    itemsize = torch.empty((), dtype=dtype).element_size()
    header: dict[str, object] = {"__metadata__": {"format": "pt", "made_by": "trainsup benchmarks/gpu/make_flux_bed"}}
    offset = 0
    for k in keys:
        n = math.prod(shapes[k]) * itemsize
        header[k] = {"dtype": DTYPES[dtype], "shape": list(shapes[k]), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    total = 8 + len(blob) + offset
    if os.path.exists(path) and os.path.getsize(path) == total:
        log(f"{os.path.basename(path)}: complete already ({total / 1e9:.2f} GB)")
        return
    t0 = time.monotonic()
    params = sum(math.prod(s) for s in shapes.values())
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for k in keys:
            shape = shapes[k]
            std = init_std(k, shape, gain)
            if std is None:
                t = torch.full(shape, constant(k), dtype=dtype)
            else:
                gen = torch.Generator(device=device).manual_seed(zlib.crc32(k.encode()))
                t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).mul_(std).to(dtype)
            f.write(t.contiguous().cpu().view(torch.uint8).numpy().data)
    os.replace(tmp, path)
    dt = time.monotonic() - t0
    log(f"{os.path.basename(path)}: {params / 1e9:.3f}B params, {total / 1e9:.2f} GB in {dt:.1f} s")


def build_tokenizers(out: str, clip_tokenizer: str, captions: list[str]) -> None:
    """--tokenizer_cache_dir layout: join(dir, model_id.replace('/', '_')) (strategy_base._load_tokenizer)."""
    clip_dir = os.path.join(out, "openai_clip-vit-large-patch14")
    t5_dir = os.path.join(out, "google_t5-v1_1-xxl")
    if not os.path.isdir(clip_dir):
        shutil.copytree(clip_tokenizer, clip_dir)
    if os.path.isfile(os.path.join(t5_dir, "tokenizer.json")):
        return
    import sentencepiece as spm
    from transformers import T5TokenizerFast

    os.makedirs(out, exist_ok=True)
    corpus = os.path.join(out, "t5_corpus.txt")
    words = " ".join(captions).split()
    with open(corpus, "w") as f:  # 400 lines are plenty: the text only needs to cover the captions
        f.writelines(" ".join(words[(i + j) % len(words)] for j in range(12)) + "\n" for i in range(400))
    prefix = os.path.join(out, "spiece")
    spm.SentencePieceTrainer.train(input=corpus, model_prefix=prefix, vocab_size=200, model_type="unigram",
                                   pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False,
                                   minloglevel=2)
    tok = T5TokenizerFast(vocab_file=prefix + ".model")
    tok.save_pretrained(t5_dir)
    ids = tok(captions[0])["input_ids"]
    assert max(ids) < 32128, ids
    log(f"T5 tokenizer: vocab {len(tok)} -> {t5_dir}")


CAPTIONS = ["a red square on a grey field", "a blue circle on a white field",
            "a green stripe on a black field", "a yellow cross on a dark blue field"]
COLOURS = [(200, 30, 30), (30, 60, 200), (30, 170, 60), (230, 210, 40)]


def build_data(out: str, res: int, prompt: str) -> None:
    from PIL import Image, ImageDraw

    images = os.path.join(out, "images")
    os.makedirs(images, exist_ok=True)
    for i, (caption, colour) in enumerate(zip(CAPTIONS, COLOURS)):
        img = Image.new("RGB", (res, res), (90 + 40 * i, 90, 120))
        d = ImageDraw.Draw(img)
        q = res // 4
        d.rectangle([q, q, 3 * q, 3 * q], fill=colour)
        img.save(os.path.join(images, f"img{i}.png"))
        with open(os.path.join(images, f"img{i}.txt"), "w") as f:
            f.write(caption + "\n")
    with open(os.path.join(out, "dataset.toml"), "w") as f:
        f.write("[general]\ncaption_extension = \".txt\"\nshuffle_caption = false\n\n"
                f"[[datasets]]\nresolution = {res}\nbatch_size = 1\nenable_bucket = false\n\n"
                f"[[datasets.subsets]]\nimage_dir = \"{images}\"\nnum_repeats = 1\n")
    with open(os.path.join(out, "prompts.txt"), "w") as f:
        f.write(prompt + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sd-scripts", required=True)
    ap.add_argument("--clip-tokenizer", required=True, help="a folder with CLIP-L's vocab.json and merges.txt")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--double", type=int, help="double blocks (19 in Flux.1-dev); fewer only to rehearse")
    ap.add_argument("--single", type=int, help="single blocks (38 in Flux.1-dev); fewer only to rehearse")
    ap.add_argument("--res", type=int, default=256)
    ap.add_argument("--gain", type=float, default=0.5)
    ap.add_argument("--only", choices=["layout", "small", "all"], default="all",
                    help="layout: print parameter counts; small: all but the Flux and T5 weights")
    a = ap.parse_args()

    os.makedirs(a.out, exist_ok=True)
    shapes = layouts(a.sd_scripts, a.double, a.single)
    for name, s in shapes.items():
        log(f"{name}: {len(s)} tensors, {sum(math.prod(v) for v in s.values()) / 1e9:.3f}B params")
    if a.only == "layout":
        return 0
    res = a.res
    build_data(os.path.join(a.out, "data"), res, f"a red square on a grey field --w {res} --h {res} --s 2 --d 1")
    build_tokenizers(os.path.join(a.out, "tokenizers"), a.clip_tokenizer, CAPTIONS)
    bf16 = torch.bfloat16
    write_safetensors(os.path.join(a.out, "ae.safetensors"), shapes["ae"], bf16, a.device, a.gain)
    missing = dict(shapes["ae"])
    del missing["decoder.conv_out.bias"]
    write_safetensors(os.path.join(a.out, "ae_missing_key.safetensors"), missing, bf16, a.device, a.gain)
    write_safetensors(os.path.join(a.out, "clip_l.safetensors"), shapes["clip_l"], bf16, a.device, a.gain)
    if a.only == "small":
        return 0
    write_safetensors(os.path.join(a.out, "t5xxl.safetensors"), shapes["t5xxl"], bf16, a.device, a.gain)
    write_safetensors(os.path.join(a.out, "flux1-dev.safetensors"), shapes["flux"], bf16, a.device, a.gain)
    return 0


if __name__ == "__main__":
    sys.exit(main())
