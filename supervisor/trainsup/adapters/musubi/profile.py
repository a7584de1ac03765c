"""Owns what musubi-tuner is, as the shared kohya modules need it: its training scripts, the flags
they have and lack, and its ``Dialect``.

Facts from musubi-tuner's code (snapshot 0.3.4) and its real CPU bed (the project's realmusubi notes):
every ``*_train_network.py`` and full ``*_train.py`` is a training script; ``--sdpa`` (or another
attention flag) is mandatory; there is no ``--initial_step``, ``--skip_until_initial_step``,
``--lowram``, ``--lowvram`` or text-encoder/latent caching flag (caching is a separate program); a
state is accelerate's files alone (no ``train_state.json``); after ``--resume`` its step and epoch
counters restart at 0 and it trains exactly ``--max_train_steps`` more steps, with another data
order than an uninterrupted run's at any state (its buckets are shuffled by ``seed + epoch``, its
epoch count restarts): no state resumes it exactly, so none is preferred.
"""

from __future__ import annotations

from ..kohya.dialect import Dialect, PromptOptions
from ..kohya.profile import ScriptInfo

# Every training script of the snapshot (``src/musubi_tuner/*train*.py``), LoRA and full fine-tuning.
# A test reads the snapshot's list and checks this one against it.
SCRIPTS = frozenset({
    "wan_train_network",
    "hv_train_network", "hv_train", "hv_1_5_train_network",
    "fpack_train_network",
    "flux_kontext_train_network", "flux_2_train_network", "flux_2_train_network_self_flow",
    "qwen_image_train_network", "qwen_image_train",
    "zimage_train_network", "zimage_train",
    "kandinsky5_train_network",
    "krea2_train_network",
    "hidream_o1_train_network", "hidream_o1_train",
    "ideogram4_train_network",
})

# The attention flags, one of which every training script requires (it exits 1 without).
ATTENTION = ("sdpa", "flash_attn", "sage_attn", "xformers", "flash3")

# Flags no musubi script has (sd-scripts' and others' that a remedy or a user might reach for).
_NOWHERE = frozenset({"initial_step", "skip_until_initial_step", "lowram", "lowvram", "cache_latents",
                      "cache_latents_to_disk", "cache_text_encoder_outputs", "cache_text_encoder_outputs_to_disk",
                      "no_half_vae", "fp8_base_unet"})
# Scripts without --fp8_scaled (their parser does not add it).
_NO_FP8_SCALED = frozenset({"hv_train", "ideogram4_train_network"})

# argparse store_true flags of its parser (``training/parser_common.py``) and the scripts' own that
# remedies touch or read; they carry no value.
STORE_TRUE = frozenset({
    *ATTENTION, "split_attn", "compile", "persistent_data_loader_workers", "gradient_checkpointing",
    "gradient_checkpointing_cpu_offload", "sample_at_first", "fp8_base", "fp8_scaled", "fp8_t5", "fp8_llm",
    "full_fp16", "full_bf16", "use_pinned_memory_for_block_swap", "block_swap_h2d_only",
    "img_in_txt_in_offloading", "disable_numpy_memmap", "no_metadata", "save_state",
    "save_state_on_train_end", "vae_cache_cpu",
})


class MusubiScript(ScriptInfo):
    def has_flag(self, flag: str) -> bool:
        if flag in _NOWHERE:
            return False
        return not (flag == "fp8_scaled" and self.script in _NO_FP8_SCALED)


def script_info(script: str) -> ScriptInfo:
    return MusubiScript(script, "dit" if script in SCRIPTS else "unknown")


def is_training_script(script: str) -> bool:
    return script in SCRIPTS


# Sample-prompt ``.txt`` options (``training/sampling_prompts.py``): ints read as ``\d+`` only.
PROMPT_OPTIONS = PromptOptions(frozenset({"w", "h", "f", "d", "s"}), frozenset({"g", "fs", "l"}),
                               frozenset({"n", "i", "ei", "cn", "ci", "of"}), negative_ints=False)

MUSUBI = Dialect(
    trainer="musubi", words="musubi-tuner", info=script_info, store_true=STORE_TRUE, state_first=(),
    prompt_options=PROMPT_OPTIONS, overshoots=False, epochs_restart=True, exact_at_epoch_end=False,
)
