"""Owns what the kohya trainer family means: script kinds, which flags exist where, file naming.

Facts from kohya sd-scripts (see the project's kohya notes): state and weight names sit directly in
``--output_dir``; ``--cache_text_encoder_outputs`` does not exist in SD1 ``train_network.py``;
``--blocks_to_swap`` only in DiT scripts; ``--lowvram`` nowhere. musubi-tuner shares the naming
(its own scripts and flags are ``adapters.musubi``'s).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Script kinds: "sd" (SD1/2), "sdxl", "dit" (Flux, SD3, Lumina). musubi-tuner's scripts (wan_, hv_,
# fpack_train_network ...) are not sd-scripts': the musubi family claims them.
_SCRIPT_KINDS = {
    "train_network": "sd",
    "train_db": "sd",
    "fine_tune": "sd",
    "train_textual_inversion": "sd",
    "sdxl_train_network": "sdxl",
    "sdxl_train": "sdxl",
    "flux_train_network": "dit",
    "flux_train": "dit",
    "sd3_train_network": "dit",
    "sd3_train": "dit",
    "lumina_train_network": "dit",
}

# Flags that exist only for some script kinds; every other flag is passed through untouched.
_FLAG_KINDS: dict[str, frozenset[str]] = {
    "cache_text_encoder_outputs": frozenset({"sdxl", "dit"}),
    "cache_text_encoder_outputs_to_disk": frozenset({"sdxl", "dit"}),
    "blocks_to_swap": frozenset({"dit"}),
    "lowvram": frozenset(),
}

# argparse store_true flags of the kohya scripts that remedies touch or read; they carry no value.
STORE_TRUE = frozenset(
    {
        "save_state", "fp8_base", "fp8_base_unet", "cache_latents", "cache_latents_to_disk",
        "cache_text_encoder_outputs", "cache_text_encoder_outputs_to_disk", "gradient_checkpointing",
        "skip_until_initial_step", "no_half_vae", "lowram", "persistent_data_loader_workers",
        "network_train_unet_only", "network_train_text_encoder_only", "full_bf16", "full_fp16",
        "shuffle_caption", "console_log_simple", "save_state_on_train_end", "xformers", "sdpa",
    }
)

# Flags that must not change between a state and the attempt that resumes it (kohya loads strictly).
RESUME_LOCKED = ("network_dim", "network_module", "network_args", "network_train_unet_only",
                 "optimizer_type")

DEFAULT_STEP_NAME = "at"
DEFAULT_EPOCH_NAME = "epoch"
DEFAULT_LAST_NAME = "last"

_STEP_STATE = re.compile(r"^(?P<name>.+)-step(?P<step>\d{8})-state$")
_EPOCH_STATE = re.compile(r"^(?P<name>.+)-(?P<epoch>\d{6})-state$")


@dataclass(frozen=True)
class ScriptInfo:
    script: str
    kind: str  # "sd", "sdxl", "dit" or "unknown"

    def has_flag(self, flag: str) -> bool:
        kinds = _FLAG_KINDS.get(flag)
        if kinds is None:
            return True
        return self.kind in kinds or (self.kind == "unknown" and bool(kinds))


# sd-scripts' scripts whose states hold no train_state.json (only train_network.py's NetworkTrainer, which
# every *_train_network.py subclasses, writes one): their --resume loads the weights, optimizer and random
# states and then counts steps and epochs from 0 again, so no state of theirs resumes a run where it was.
_NO_STEP_IN_STATE = frozenset({
    "train_db", "fine_tune", "sdxl_train", "flux_train", "sd3_train", "lumina_train", "anima_train",
    "train_textual_inversion", "train_textual_inversion_XTI", "sdxl_train_textual_inversion",
    "train_controlnet", "train_control_net", "sdxl_train_control_net", "flux_train_control_net",
    "sdxl_train_control_net_lllite", "sdxl_train_control_net_lllite_old",
})


def state_holds_step(script: str) -> bool:
    """Whether a state of this script records its step (``train_state.json``); unknown scripts: assumed."""
    return script.removesuffix(".py") not in _NO_STEP_IN_STATE


def script_info(script: str) -> ScriptInfo:
    return ScriptInfo(script, _SCRIPT_KINDS.get(script, "unknown"))


def takes_value(flag: str) -> bool:
    return flag not in STORE_TRUE


def final_weights_name(output_name: str | None) -> str:
    return f"{output_name or DEFAULT_LAST_NAME}.safetensors"


def state_dir_names(output_name: str | None) -> tuple[str, str, str]:
    """The prefixes kohya uses for step states, epoch states and the final state."""
    return (output_name or DEFAULT_STEP_NAME, output_name or DEFAULT_EPOCH_NAME,
            f"{output_name or DEFAULT_LAST_NAME}-state")


def save_names(output_name: str | None, kind: str, number: int | None, ext: str = "safetensors") -> tuple[str, str]:
    """(weights file, state dir) of a save of this kind (step, epoch or final) and number."""
    step_name, epoch_name, final = state_dir_names(output_name)
    if kind == "step":
        return f"{step_name}-step{number:08d}.{ext}", f"{step_name}-step{number:08d}-state"
    if kind == "epoch":
        return f"{epoch_name}-{number:06d}.{ext}", f"{epoch_name}-{number:06d}-state"
    return final_weights_name(output_name), final


def parse_state_name(dirname: str) -> tuple[str, str, int | None] | None:
    """(name, kind, number) for a kohya state dir name; kind is step, epoch or final."""
    m = _STEP_STATE.match(dirname)
    if m:
        return m.group("name"), "step", int(m.group("step"))
    m = _EPOCH_STATE.match(dirname)
    if m:
        return m.group("name"), "epoch", int(m.group("epoch"))
    if dirname.endswith("-state") and len(dirname) > len("-state"):
        return dirname[: -len("-state")], "final", None
    return None


def weights_files_for(output_name: str | None) -> re.Pattern[str]:
    """Matches the weights files one attempt writes under this output name."""
    names = sorted({output_name or DEFAULT_STEP_NAME, output_name or DEFAULT_EPOCH_NAME,
                    output_name or DEFAULT_LAST_NAME})
    alt = "|".join(re.escape(n) for n in names)
    return re.compile(rf"^(?:{alt})(?:-step\d{{8}}|-\d{{6}})?\.(?:safetensors|ckpt|pt)$")
