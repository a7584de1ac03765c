"""Command line and `--config_file` handling of the demo trainer scripts.

Owns the argparse definitions (the subset of sd-scripts' flags the demo
understands, with the same names, defaults and store_true semantics), the
per-script differences (the text-encoder caching flags exist only in the Flux
script), and kohya's TOML merge: sections are flattened into a Namespace that
argparse then fills, so the command line overrides the file and a store_true
set true in the file stays true. Like sd-scripts, unknown TOML keys are kept
silently in the namespace.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tomllib

from .logfmt import setup_logging

logger = logging.getLogger(__name__)

REQUIRED = ("pretrained_model_name_or_path", "output_dir")


class ConfigFileNotFound(Exception):
    """`--config_file` names a file that does not exist (kohya logs it and exits 1)."""


def _flag(parser: argparse.ArgumentParser, name: str, help_text: str) -> None:
    parser.add_argument(f"--{name}", action="store_true", help=help_text)


def build_parser(flux: bool) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    # logging (library/utils.add_logging_arguments)
    parser.add_argument(
        "--console_log_level", type=str, default=None, choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
    )
    _flag(parser, "console_log_simple", "simple log output / シンプルなログ出力")
    # model and dataset
    parser.add_argument("--pretrained_model_name_or_path", type=str, default=None, help="base model checkpoint")
    parser.add_argument("--train_data_dir", type=str, default=None, help="directory for train images")
    parser.add_argument("--dataset_config", type=str, default=None, help="config file for detail settings")
    _flag(parser, "color_aug", "enable weak color augmentation")
    _flag(parser, "random_crop", "enable random crop")
    # kohya defaults to .caption; the demo assets (and most datasets) use .txt
    parser.add_argument("--caption_extension", type=str, default=".txt", help="extension of caption files")
    _flag(parser, "cache_latents", "cache latents to main memory")
    _flag(parser, "cache_latents_to_disk", "cache latents to disk (implies --cache_latents)")
    parser.add_argument("--max_data_loader_n_workers", type=int, default=0, help="DataLoader worker processes")
    # output and saving
    parser.add_argument("--output_dir", type=str, default=None, help="directory to output trained model")
    parser.add_argument("--output_name", type=str, default=None, help="base name of trained model file")
    parser.add_argument("--save_every_n_steps", type=int, default=None, help="save checkpoint every N steps")
    parser.add_argument("--save_every_n_epochs", type=int, default=None, help="save checkpoint every N epochs")
    _flag(parser, "save_state", "save training state additionally (including optimizer states etc.)")
    parser.add_argument("--resume", type=str, default=None, help="saved state to resume training")
    parser.add_argument("--initial_step", type=int, default=None, help="initial step number")
    _flag(parser, "skip_until_initial_step", "skip training until initial_step is reached")
    # training
    parser.add_argument("--max_train_steps", type=int, default=1600, help="training steps")
    parser.add_argument("--seed", type=int, default=None, help="random seed for training")
    parser.add_argument("--train_batch_size", type=int, default=1, help="batch size for training")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    _flag(parser, "gradient_checkpointing", "enable gradient checkpointing")
    _flag(parser, "lowram", "load models to VRAM instead of RAM (accepted; the demo is small)")
    parser.add_argument("--mixed_precision", type=str, default="no", choices=["no", "fp16", "bf16"])
    _flag(parser, "fp8_base", "use fp8 for base model")
    parser.add_argument("--optimizer_type", type=str, default="AdamW", help="optimizer (the demo has AdamW)")
    parser.add_argument("--learning_rate", type=float, default=1e-4, help="learning rate")
    # network
    parser.add_argument("--network_module", type=str, default=None, help="network module to train")
    parser.add_argument("--network_dim", type=int, default=4, help="network dimensions (rank)")
    parser.add_argument("--network_alpha", type=float, default=1, help="alpha for LoRA weight scaling")
    # sampling
    parser.add_argument("--sample_prompts", type=str, default=None, help="file for prompts to generate samples")
    parser.add_argument("--sample_every_n_steps", type=int, default=None, help="generate samples every N steps")
    parser.add_argument("--sample_every_n_epochs", type=int, default=None,
                        help="generate samples every N epochs (overwrites n_steps)")
    _flag(parser, "sample_at_first", "generate sample images before training")
    # config
    parser.add_argument("--config_file", type=str, default=None,
                        help="using .toml instead of args to pass hyperparameter")
    if flux:
        _flag(parser, "cache_text_encoder_outputs", "cache outputs of text encoders")
        _flag(parser, "cache_text_encoder_outputs_to_disk", "cache outputs of text encoders to disk")
    return parser


def read_config_from_file(args: argparse.Namespace, parser: argparse.ArgumentParser) -> argparse.Namespace:
    """kohya's train_util.read_config_from_file: flatten sections, then let argparse fill the rest."""
    if not args.config_file:
        return args
    config_path = args.config_file if args.config_file.endswith(".toml") else args.config_file + ".toml"
    if not os.path.exists(config_path):
        logger.info(f"{config_path} not found.")
        raise ConfigFileNotFound(config_path)
    logger.info(f"Loading settings from {config_path}...")
    with open(config_path, "rb") as f:
        config_dict = tomllib.load(f)
    flat: dict[str, object] = {}
    for section, values in config_dict.items():
        if isinstance(values, dict):
            flat.update(values)
        else:
            flat[section] = values
    # argparse only assigns defaults to names missing from the namespace, so TOML values
    # survive unless the command line names them again
    merged = parser.parse_args(namespace=argparse.Namespace(**flat))
    merged.config_file = os.path.splitext(merged.config_file)[0]
    logger.info(merged.config_file)
    return merged


def verify_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Checks that need the merged arguments; mistakes end like argparse's (exit 2)."""
    missing = [f"--{name}" for name in REQUIRED if not getattr(args, name, None)]
    if not args.train_data_dir and not args.dataset_config:
        missing.append("--train_data_dir (or --dataset_config)")
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")
    if args.cache_latents_to_disk and not args.cache_latents:
        args.cache_latents = True
        logger.warning(
            "cache_latents_to_disk is enabled, so cache_latents is also enabled"
            " / cache_latents_to_diskが有効なため、cache_latentsを有効にします"
        )
    if getattr(args, "cache_text_encoder_outputs_to_disk", False) and not args.cache_text_encoder_outputs:
        args.cache_text_encoder_outputs = True
        logger.warning(
            "cache_text_encoder_outputs_to_disk is enabled, so cache_text_encoder_outputs is also enabled"
            " / cache_text_encoder_outputs_to_diskが有効になっているため、cache_text_encoder_outputsも有効になります"
        )
    if args.sample_every_n_steps is not None and args.sample_every_n_steps <= 0:
        logger.warning(
            "sample_every_n_steps is less than or equal to 0, so it will be disabled"
            " / sample_every_n_stepsに0以下の値が指定されたため無効になります"
        )
        args.sample_every_n_steps = None
    if args.sample_every_n_epochs is not None and args.sample_every_n_epochs <= 0:
        logger.warning(
            "sample_every_n_epochs is less than or equal to 0, so it will be disabled"
            " / sample_every_n_epochsに0以下の値が指定されたため無効になります"
        )
        args.sample_every_n_epochs = None
    if args.network_module is None:
        args.network_module = "networks.lora"


def parse(argv: list[str] | None, flux: bool) -> argparse.Namespace:
    """Parse the command line, merge `--config_file`, verify. Raises ConfigFileNotFound."""
    parser = build_parser(flux)
    args = parser.parse_args(argv)
    args = read_config_from_file(args, parser)
    verify_args(args, parser)
    return args


def parse_command_line(argv: list[str] | None, flux: bool) -> argparse.Namespace | None:
    """What a script does first: logging on, arguments parsed; None when the config file is missing.

    Argument mistakes exit here (status 2) before torch is imported, so they fail at once.
    """
    setup_logging()
    try:
        args = parse(argv, flux)
    except ConfigFileNotFound:
        return None
    # kohya's setup_logging(args, reset=True): the options may come from the config file
    setup_logging(simple=bool(args.console_log_simple), level=args.console_log_level)
    return args


def script_main(flux: bool, argv: list[str] | None = None) -> None:
    """What both demo scripts run: parse, then (torch imported only now) train, then exit."""
    # The first line real sd-scripts prints on a CPU with AVX512-BF16: bitsandbytes' CPU backend,
    # imported with the trainer, logs it before any handler is set up (a bare message on stderr).
    # Training goes on; a supervisor must not take it for a missing dependency.
    print("Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'. Please make "
          "sure you already `pip install kernels` and the kernels >= 0.11.1", file=sys.stderr, flush=True)
    args = parse_command_line(argv, flux=flux)
    if args is None:
        sys.exit(1)
    from trainsup.demo.arch import FLUX, SD
    from trainsup.demo.core import train

    sys.exit(train(FLUX if flux else SD, args))
