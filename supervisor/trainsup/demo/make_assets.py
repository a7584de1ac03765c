"""Writes the demo trainer's inputs: base models, a tiny dataset and a prompt file.

Owns the asset layout used by the demo and the tests:
`DIR/model.safetensors` (text encoder, VAE and denoiser in the trainer's `unet.`
layout), `DIR/model_fp8.safetensors` (an fp8 repack: the denoiser stored as
float8_e4m3fn under `model.diffusion_model.`, which only `--fp8_base` loads),
`DIR/dataset/1_demo/` (8 deterministic 16x16 PNG images with `.txt` captions)
and `DIR/prompts.txt` (kohya prompt-file format).
Run as `python -m trainsup.demo.make_assets DIR`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from .model import FP8_UNET_PREFIX, IMAGE_SIZE, UNET_PREFIX, build_reference_state_dict
from .png import write_png

NUM_IMAGES = 8
SUBSET = "1_demo"
CAPTIONS = [
    "a red square on a blue background",
    "a green circle in the middle",
    "horizontal stripes of yellow and black",
    "a diagonal gradient from purple to orange",
    "a checkerboard of white and grey",
    "a blue triangle on white",
    "vertical stripes of red and green",
    "a dark picture with one bright dot",
]
PROMPTS = """# demo sample prompts (kohya prompt-file format: prompt --w W --h H --d SEED --s STEPS)
a red square on a blue background --w 16 --h 16 --d 42 --s 4
a green circle in the middle --w 16 --h 16 --d 7 --s 4
"""


def demo_image(index: int) -> np.ndarray:
    """A deterministic 16x16 RGB pattern that differs per index."""
    y, x = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE]
    r = (x * 16 + index * 37) % 256
    g = (y * 16 + index * 59) % 256
    b = ((x + y) * 8 + index * 83) % 256
    if index % 2:
        # odd images get a block pattern so the set is not just shifted gradients
        block = ((x // 4 + y // 4 + index) % 2) * 96
        r, b = (r + block) % 256, (b + 255 - block) % 256
    return np.stack([r, g, b], axis=2).astype(np.uint8)


def make_assets(dir: Path) -> dict[str, Path]:
    """Write all assets under `dir` (created if needed) and return their paths by role."""
    dir = Path(dir)
    dir.mkdir(parents=True, exist_ok=True)
    sd = build_reference_state_dict()
    model = dir / "model.safetensors"
    save_file(sd, str(model), metadata={"format": "pt"})

    fp8_sd: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        if key.startswith(UNET_PREFIX):
            fp8_key = FP8_UNET_PREFIX + key[len(UNET_PREFIX) :]
            # repacks quantise the weight matrices and usually keep biases in higher precision
            fp8_sd[fp8_key] = value.to(torch.float8_e4m3fn) if key.endswith(".weight") else value
        else:
            fp8_sd[key] = value
    model_fp8 = dir / "model_fp8.safetensors"
    save_file(fp8_sd, str(model_fp8), metadata={"format": "pt"})

    dataset = dir / "dataset"
    subset = dataset / SUBSET
    subset.mkdir(parents=True, exist_ok=True)
    for i in range(NUM_IMAGES):
        write_png(subset / f"img{i:02d}.png", demo_image(i))
        (subset / f"img{i:02d}.txt").write_text(CAPTIONS[i] + "\n", encoding="utf-8")

    prompts = dir / "prompts.txt"
    prompts.write_text(PROMPTS, encoding="utf-8")
    return {"model": model, "model_fp8": model_fp8, "dataset": dataset, "subset": subset, "prompts": prompts}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainsup.demo.make_assets", description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="directory to write the assets into")
    args = parser.parse_args(argv)
    for role, path in make_assets(args.dir).items():
        print(f"{role}: {path}")
    sys.exit(0)


if __name__ == "__main__":
    main()
