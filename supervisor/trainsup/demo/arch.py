"""What differs between the SD-style and the Flux-style demo trainer.

Owns the per-architecture facts the shared engine asks for: the objective
(SD: DDPM epsilon prediction on integer timesteps; Flux: rectified-flow
velocity with sigmoid-sampled t), the sampler's denoising update, the cache
file suffixes, and whether text-encoder outputs can be cached (Flux only, which
is also what makes prompts edited mid-run fail there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NUM_TRAIN_TIMESTEPS = 1000


def _alphas_cumprod() -> torch.Tensor:
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, NUM_TRAIN_TIMESTEPS, dtype=torch.float64) ** 2
    return torch.cumprod(1.0 - betas, dim=0).float()


_ALPHAS_CUMPROD = _alphas_cumprod()


@dataclass(frozen=True)
class Arch:
    name: str
    latents_suffix: str
    te_suffix: str | None

    @property
    def caches_text_encoder(self) -> bool:
        return self.te_suffix is not None

    def noisy_input(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(model input, t in [0, 1], target); noise and timesteps come from the global torch RNG."""
        noise = torch.randn_like(latents)
        batch = latents.shape[0]
        if self.name == "flux":
            t = torch.sigmoid(torch.randn(batch))
            tb = t[:, None, None, None]
            return (1.0 - tb) * latents + tb * noise, t, noise - latents
        timesteps = torch.randint(0, NUM_TRAIN_TIMESTEPS, (batch,))
        a = _ALPHAS_CUMPROD[timesteps][:, None, None, None]
        noisy = a.sqrt() * latents + (1.0 - a).sqrt() * noise
        return noisy, timesteps.float() / NUM_TRAIN_TIMESTEPS, noise

    def denoise_step(self, x: torch.Tensor, pred: torch.Tensor, t: float, t_next: float) -> torch.Tensor:
        """One sampler step from t to t_next (t decreasing towards 0)."""
        if self.name == "flux":
            return x + (t_next - t) * pred
        a = _ALPHAS_CUMPROD[min(int(t * NUM_TRAIN_TIMESTEPS), NUM_TRAIN_TIMESTEPS - 1)]
        a_next = _ALPHAS_CUMPROD[min(int(t_next * NUM_TRAIN_TIMESTEPS), NUM_TRAIN_TIMESTEPS - 1)]
        x0 = (x - (1.0 - a).sqrt() * pred) / a.sqrt()
        return a_next.sqrt() * x0 + (1.0 - a_next).sqrt() * pred


SD = Arch(name="sd", latents_suffix="_sd.npz", te_suffix=None)
FLUX = Arch(name="flux", latents_suffix="_flux.npz", te_suffix="_flux_te.npz")
