"""Sample image generation during training, including its kohya failure modes.

Owns the prompt file format (one prompt per line, `#` comments, ` --w/--h/--d/--s/--n`
options), re-reading the file at every sampling point as sd-scripts does, the
Flux-style start-up cache of prompt encodings (a prompt edited mid-run finds no
entry and fails on the T5 attention mask), generating the tiny images with a
private generator so the training RNG is never perturbed, and the sample
outputs (`sample/*.png` plus `sample/prompts_used.jsonl`), named as kohya names them:
`[NAME_]STEP6_II_TIMESTAMP[_SEED].png`, an epoch's `eEPOCH6` (`--sample_at_first`: `e000000`),
with the step the trainer counts (after a resume, from 0 again).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import re
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import faults
from .arch import Arch
from .logfmt import ProgressBar
from .model import LATENT_CH, LATENT_HW, VAE, Denoiser, TextEncoder
from .png import resize_nearest, write_png

logger = logging.getLogger(__name__)

TeOutput = tuple[torch.Tensor, torch.Tensor]


@dataclass
class PromptSpec:
    prompt: str
    negative_prompt: str = ""
    width: int = 16
    height: int = 16
    seed: int | None = None
    steps: int = 4


def load_prompts(path: Path) -> list[PromptSpec]:
    """kohya's prompt-file reading: ``.txt`` (options follow the prompt as `` --x value``), ``.toml``
    (``[[prompt.subset]]`` tables inheriting ``[prompt]``'s keys) or ``.json`` (a list); like kohya,
    a malformed file raises while sampling."""
    if path.suffix == ".toml":
        with open(path, "rb") as f:
            data = tomllib.load(f)
        return [_spec_from_dict({**data["prompt"], **subset}) for subset in data["prompt"]["subset"]]
    if path.suffix == ".json":
        items = json.loads(path.read_text(encoding="utf-8"))
        return [_spec_from_dict(i) if isinstance(i, dict) else _spec_from_line(str(i)) for i in items]
    lines = (raw.strip() for raw in path.read_text(encoding="utf-8").splitlines())
    return [_spec_from_line(line) for line in lines if line and not line.startswith("#")]


def _spec_from_dict(d: dict[str, Any]) -> PromptSpec:
    spec = PromptSpec(prompt=str(d.get("prompt", "")), negative_prompt=str(d.get("negative_prompt") or ""))
    spec.width, spec.height = int(d.get("width", spec.width)), int(d.get("height", spec.height))
    spec.seed = None if d.get("seed") is None else int(d["seed"])
    spec.steps = max(1, min(int(d.get("sample_steps", spec.steps)), 1000))
    return spec


def _spec_from_line(line: str) -> PromptSpec:
    parts = line.split(" --")
    spec = PromptSpec(prompt=parts[0].strip())
    for part in parts[1:]:
        if m := re.match(r"w (\d+)", part, re.IGNORECASE):
            spec.width = int(m.group(1))
        elif m := re.match(r"h (\d+)", part, re.IGNORECASE):
            spec.height = int(m.group(1))
        elif m := re.match(r"d (\d+)", part, re.IGNORECASE):
            spec.seed = int(m.group(1))
        elif m := re.match(r"s (\d+)", part, re.IGNORECASE):
            spec.steps = max(1, min(int(m.group(1)), 1000))
        elif m := re.match(r"n (.+)", part, re.IGNORECASE):
            spec.negative_prompt = m.group(1).strip()
    return spec


def cache_prompt_outputs(path: Path, text_encoder: TextEncoder) -> dict[str, TeOutput]:
    """Encode the sample prompts once, at start-up (Flux with --cache_text_encoder_outputs)."""
    logger.info(f"cache Text Encoder outputs for sample prompt: {path}")
    cache: dict[str, TeOutput] = {}
    for spec in load_prompts(path):
        for text in (spec.prompt, spec.negative_prompt):
            if text not in cache:
                logger.info(f"cache Text Encoder outputs for prompt: {text}")
                hidden, mask = text_encoder.encode_texts([text])
                cache[text] = (hidden, mask)
    return cache


class SampleWriter:
    """Generates the samples of one step; knows where they go and how prompts are encoded."""

    def __init__(
        self,
        arch: Arch,
        prompts_file: Path,
        output_dir: Path,
        output_name: str | None,
        mixed_precision: bool,
        sim: faults.Simulation,
    ) -> None:
        self.arch = arch
        self.prompts_file = prompts_file
        self.sample_dir = output_dir / "sample"
        self.prefix = f"{output_name}_" if output_name else ""
        self.mixed_precision = mixed_precision
        self.sim = sim
        self.prompt_cache: dict[str, TeOutput] | None = None

    def _encode(self, prompt: str, text_encoder: TextEncoder | None) -> TeOutput:
        if self.prompt_cache is not None:
            # what Flux sampling does with cached outputs: a missing prompt yields None...
            hidden, cached_mask = self.prompt_cache.get(prompt, (None, None))
            # ...and the T5 attention mask is the first thing moved to the device
            mask = cached_mask.to("cpu")  # type: ignore[union-attr]
            return hidden, mask  # type: ignore[return-value]
        assert text_encoder is not None, "sampling needs the text encoder or cached prompt outputs"
        return text_encoder.encode_texts([prompt])

    @staticmethod
    def due(args: argparse.Namespace, epoch: int | None, steps: int) -> bool:
        """kohya's sample_images_common gate: at step 0 only with --sample_at_first; with
        --sample_every_n_epochs only at the end of such an epoch (--sample_every_n_steps ignored);
        else at every N-th step the trainer counts, never at an epoch's end."""
        if steps == 0:
            return bool(args.sample_at_first)
        if args.sample_every_n_epochs is not None:
            return epoch is not None and epoch % args.sample_every_n_epochs == 0
        every = args.sample_every_n_steps
        return every is not None and steps % every == 0 and epoch is None

    def sample(
        self, step: int, unet: Denoiser, vae: VAE, text_encoder: TextEncoder | None, latents_cached: bool,
        epoch: int | None = None,
    ) -> None:
        logger.info("")
        logger.info(f"generating sample images at step / サンプル画像生成 ステップ: {step}")
        if not self.prompts_file.is_file():
            logger.error(f"No prompt file / プロンプトファイルがありません: {self.prompts_file}")
            return
        faults.at_sampling(self.sim, latents_cached)
        self.sample_dir.mkdir(parents=True, exist_ok=True)
        # sd-scripts reads the prompt file again at every sampling point
        specs = load_prompts(self.prompts_file)
        # keep the global RNG streams untouched: resumed runs must see the same noise
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            for index, spec in enumerate(specs):
                self._one(step, epoch, index, spec, unet, vae, text_encoder)

    def _one(
        self, step: int, epoch: int | None, index: int, spec: PromptSpec, unet: Denoiser, vae: VAE,
        text_encoder: TextEncoder | None,
    ) -> None:
        seed = spec.seed if spec.seed is not None else step * 100 + index
        logger.info(f"prompt: {spec.prompt}")
        logger.info(f"height: {spec.height}")
        logger.info(f"width: {spec.width}")
        logger.info(f"sample_steps: {spec.steps}")
        logger.info(f"seed: {seed}")
        hidden, mask = self._encode(spec.prompt, text_encoder)
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(1, LATENT_CH, LATENT_HW, LATENT_HW, generator=generator)
        times = torch.linspace(1.0, 0.0, spec.steps + 1).tolist()
        bar = ProgressBar(spec.steps)  # kohya's nested denoising bar, one per sampled image
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.mixed_precision):
            for t, t_next in itertools.pairwise(times):
                pred = unet(x, torch.full((1,), t), hidden, mask).float()
                x = self.arch.denoise_step(x, pred, t, t_next)
                faults.pace_denoise(self.sim, spec.steps)
                bar.update(1)
            image = vae.decode(x.float()).float()[0]
        bar.close()
        rgb = ((image.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 0).numpy()
        width, height = min(max(spec.width, 1), 256), min(max(spec.height, 1), 256)
        number = f"e{epoch:06d}" if epoch is not None else f"{step:06d}"
        stamp = time.strftime("%Y%m%d%H%M%S", time.localtime())
        seeded = "" if spec.seed is None else f"_{spec.seed}"
        path = self.sample_dir / f"{self.prefix}{number}_{index:02d}_{stamp}{seeded}.png"
        write_png(path, resize_nearest(np.ascontiguousarray(rgb), width, height))
        with open(self.sample_dir / "prompts_used.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, "index": index, "prompt": spec.prompt, "file": str(path)}) + "\n")
