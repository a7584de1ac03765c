"""The LoRA network the demo trains on the denoiser's Linear layers.

Owns the LoRA modules (down/up matrices, `up` initialised to zero, alpha/dim
scaling, kohya's `lora_unet_*` key names), hooking them into the frozen base
Linear layers, and the two ways the network is written: the LoRA weights file
(float32 LoRA tensors only) and the full state dict that goes into a saved
state (which, with `--fp8_base`, also carries a float8 buffer).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

LORA_PREFIX_UNET = "lora_unet"
# Name of the float8 buffer kept with --fp8_base. It stands in for the float8 tensors real
# states can carry, so that an old safetensors (<= 0.4.1) fails to save the state for real.
FP8_BUFFER = "fp8_base_scale"


class LoRAModule(nn.Module):
    def __init__(self, lora_name: str, org_module: nn.Linear, dim: int, alpha: float) -> None:
        super().__init__()
        self.lora_name = lora_name
        self.lora_dim = dim
        self.lora_down = nn.Linear(org_module.in_features, dim, bias=False)
        self.lora_up = nn.Linear(dim, org_module.out_features, bias=False)
        nn.init.kaiming_uniform_(self.lora_down.weight, a=math.sqrt(5))
        # up starts at zero so the untrained network leaves the base model unchanged
        nn.init.zeros_(self.lora_up.weight)
        self.register_buffer("alpha", torch.tensor(float(alpha)))
        self.scale = float(alpha) / dim
        self.multiplier = 1.0
        self._org_module: list[nn.Linear] = [org_module]  # a list keeps it out of state_dict
        self.org_forward: Callable[[torch.Tensor], torch.Tensor] | None = None

    def apply_to(self) -> None:
        org = self._org_module[0]
        self.org_forward = org.forward
        org.forward = self.forward  # type: ignore[method-assign, assignment]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.org_forward is not None
        lora_x: torch.Tensor = self.lora_up(self.lora_down(x.to(self.lora_down.weight.dtype)))
        return self.org_forward(x) + lora_x * self.multiplier * self.scale


class LoRANetwork(nn.Module):
    def __init__(self, unet: nn.Module, dim: int, alpha: float, fp8_base: bool) -> None:
        super().__init__()
        self.loras: list[LoRAModule] = []
        for name, module in unet.named_modules():
            if isinstance(module, nn.Linear):
                lora_name = f"{LORA_PREFIX_UNET}_{name}".replace(".", "_")
                lora = LoRAModule(lora_name, module, dim, alpha)
                self.add_module(lora_name, lora)
                self.loras.append(lora)
        if fp8_base:
            self.register_buffer(FP8_BUFFER, torch.ones(len(self.loras)).to(torch.float8_e4m3fn))

    def apply_to(self) -> None:
        for lora in self.loras:
            lora.apply_to()

    def trainable_params(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def lora_state_dict(self) -> dict[str, torch.Tensor]:
        """The LoRA weights file content: float32 LoRA tensors and alphas, nothing else."""
        return {
            k: v.detach().to(torch.float32).contiguous().clone()
            for k, v in self.state_dict().items()
            if k != FP8_BUFFER
        }

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """What a saved state holds: the whole network state dict, fp8 buffer included."""
        return {k: v.detach().contiguous().clone() for k, v in self.state_dict().items()}

    def save_weights(self, path: Path, metadata: dict[str, str]) -> None:
        save_file(self.lora_state_dict(), str(path), metadata=metadata)
