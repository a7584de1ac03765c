"""The demo's tiny base model and how a checkpoint is loaded into it.

Owns the three parts of the "base model" (a text encoder, a VAE and a denoiser
standing in for the SD U-Net / Flux DiT), the tokenizer, the checkpoint key
layouts (the normal `unet.` layout and the `model.diffusion_model.` layout of
fp8 repacks) and loading the way sd-scripts does: modules are built on the meta
device and filled with `load_state_dict(strict=False, assign=True)`, so keys
that do not match leave parameters on meta until something moves the module.
"""

from __future__ import annotations

import logging
import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn
from torch.utils.checkpoint import checkpoint

logger = logging.getLogger(__name__)

VOCAB = 64
SEQ_LEN = 8
TE_DIM = 8
LATENT_CH = 4
IMAGE_SIZE = 16
VAE_DOWN = 4
LATENT_HW = IMAGE_SIZE // VAE_DOWN
LATENT_DIM = LATENT_CH * LATENT_HW * LATENT_HW
TIME_DIM = 8
HIDDEN = 96

TE_PREFIX = "text_encoder."
VAE_PREFIX = "vae."
UNET_PREFIX = "unet."
# fp8 repacks of DiT/U-Net checkpoints often keep ComfyUI's prefix instead of the trainer's
FP8_UNET_PREFIX = "model.diffusion_model."


def tokenize(text: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Hash words to ids; returns (ids [SEQ_LEN] long, attention mask [SEQ_LEN] float)."""
    words = text.lower().replace(",", " ").split()[:SEQ_LEN]
    ids = [zlib.crc32(w.encode("utf-8")) % (VOCAB - 1) + 1 for w in words]
    mask = [1.0] * len(ids) + [0.0] * (SEQ_LEN - len(ids))
    ids += [0] * (SEQ_LEN - len(ids))
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.float32)


class TextEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # an explicit (uninitialised) weight: Embedding's own normal_ init on the meta device
        # pulls in torch's Python decompositions and costs more than a whole demo run
        self.embed = nn.Embedding(VOCAB, TE_DIM, _weight=torch.empty(VOCAB, TE_DIM))
        self.proj = nn.Linear(TE_DIM, TE_DIM)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.proj(self.embed(ids)))

    def encode_texts(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (hidden [B,SEQ,TE_DIM], mask [B,SEQ]) like a T5 output plus its attention mask."""
        toks = [tokenize(t) for t in texts]
        ids = torch.stack([t[0] for t in toks])
        mask = torch.stack([t[1] for t in toks])
        with torch.no_grad():
            return self.forward(ids).float(), mask


class VAE(nn.Module):
    SCALE = 0.5

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Conv2d(3, LATENT_CH, VAE_DOWN, stride=VAE_DOWN)
        self.decoder = nn.ConvTranspose2d(LATENT_CH, 3, VAE_DOWN, stride=VAE_DOWN)

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        latents: torch.Tensor = self.encoder(images) * self.SCALE
        return latents

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.decoder(latents / self.SCALE))


class DemoLinear(nn.Linear):
    """A Linear whose weights may be stored in float8; they are upcast for compute (like fp8_base)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight if self.weight.dtype == x.dtype else self.weight.to(x.dtype)
        bias = None
        if self.bias is not None:
            bias = self.bias if self.bias.dtype == x.dtype else self.bias.to(x.dtype)
        return F.linear(x, weight, bias)


def timestep_embedding(t: torch.Tensor, dim: int = TIME_DIM) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half, dtype=torch.float32) / half)
    args = t.float()[:, None] * 1000.0 * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=1)


class Denoiser(nn.Module):
    """Stands in for the U-Net (SD) / DiT (Flux): a few Linear layers that LoRA attaches to."""

    def __init__(self) -> None:
        super().__init__()
        self.in_proj = DemoLinear(LATENT_DIM + TIME_DIM + TE_DIM, HIDDEN)
        self.mid = DemoLinear(HIDDEN, HIDDEN)
        self.out_proj = DemoLinear(HIDDEN, LATENT_DIM)
        self.gradient_checkpointing = False

    def _body(self, h: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.in_proj(h))
        return F.silu(self.mid(h))

    def forward(self, x: torch.Tensor, t: torch.Tensor, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # masked mean over tokens: padded positions must not leak into the conditioning
        weights = mask.to(hidden.dtype)[:, :, None]
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        h = torch.cat([x.flatten(1), timestep_embedding(t).to(x.dtype), pooled.to(x.dtype)], dim=1)
        if self.gradient_checkpointing and torch.is_grad_enabled():
            h = checkpoint(self._body, h, use_reentrant=False)
        else:
            h = self._body(h)
        out: torch.Tensor = self.out_proj(h)
        return out.view_as(x)


@dataclass
class BaseModel:
    text_encoder: TextEncoder | None
    vae: VAE
    unet: Denoiser


def build_reference_state_dict(seed: int = 1234) -> dict[str, torch.Tensor]:
    """The base checkpoint's tensors (used by make_assets), deterministic for a seed."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    text_encoder = TextEncoder()
    nn.init.normal_(text_encoder.embed.weight)
    parts: dict[str, nn.Module] = {TE_PREFIX: text_encoder, VAE_PREFIX: VAE(), UNET_PREFIX: Denoiser()}
    torch.random.set_rng_state(gen_state)
    sd: dict[str, torch.Tensor] = {}
    for prefix, module in parts.items():
        for key, value in module.state_dict().items():
            sd[prefix + key] = value.detach().clone().contiguous()
    return sd


def _split(sd: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}


def _unet_part(sd: dict[str, torch.Tensor], fp8_layout: bool) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        if key.startswith((TE_PREFIX, VAE_PREFIX)):
            continue
        if key.startswith(UNET_PREFIX):
            key = key[len(UNET_PREFIX) :]
        elif fp8_layout and key.startswith(FP8_UNET_PREFIX):
            key = key[len(FP8_UNET_PREFIX) :]
        out[key] = value
    return out


def load_base_model(path: Path, arch_name: str, fp8_base: bool) -> BaseModel:
    """Build every part on meta and assign the checkpoint's tensors, logging what did not match.

    Nothing is moved here: parts whose keys did not match stay on the meta device and the
    caller's `.to("cpu")` then fails inside torch, as it does in sd-scripts.
    """
    logger.info(f"Loading state dict from {path}")
    sd = load_file(str(path))
    with torch.device("meta"):
        text_encoder, vae, unet = TextEncoder(), VAE(), Denoiser()
    te_info = text_encoder.load_state_dict(_split(sd, TE_PREFIX), strict=False, assign=True)
    vae_info = vae.load_state_dict(_split(sd, VAE_PREFIX), strict=False, assign=True)
    # with --fp8_base the loader knows the fp8 repack layout; without it those keys are unexpected
    unet_info = unet.load_state_dict(_unet_part(sd, fp8_base), strict=False, assign=True)
    if arch_name == "flux":
        logger.info(f"Loaded T5xxl: {te_info}")
        logger.info(f"Loaded AE: {vae_info}")
        logger.info(f"Loaded Flux: {unet_info}")
    else:
        logger.info(f"loading text encoder: {te_info}")
        logger.info(f"loading vae: {vae_info}")
        logger.info(f"loading u-net: {unet_info}")
    return BaseModel(text_encoder=text_encoder, vae=vae, unet=unet)
