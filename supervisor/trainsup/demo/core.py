"""The shared training engine of the demo trainer scripts.

Owns the run from argument parsing to `model saved.`: the resume arithmetic
exactly as sd-scripts' train_network.py does it (including its wrong post-resume
step labels, the retrained epoch without `--skip_until_initial_step`, and the
overwrites that follow), the epoch/step loop with gradient accumulation,
sampling before saving, step/epoch/final saves, the start-up summary on stdout
and the `steps` progress bar on stderr.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from . import faults
from .arch import Arch
from .logfmt import ProgressBar, log_as
from .prepare import Session, prepare
from .state import (
    epoch_state_name,
    epoch_weights_name,
    last_state_name,
    last_weights_name,
    load_state,
    save_state,
    step_state_name,
    step_weights_name,
)

logger = logging.getLogger(__name__)


class LossRecorder:
    """kohya's moving average: one slot per step of the epoch, refilled in later epochs."""

    def __init__(self) -> None:
        self.loss_list: list[float] = []
        self.loss_total = 0.0

    def add(self, *, epoch: int, step: int, loss: float) -> None:
        if epoch == 0:
            self.loss_list.append(loss)
        else:
            while len(self.loss_list) <= step:
                self.loss_list.append(0.0)
            self.loss_total -= self.loss_list[step]
            self.loss_list[step] = loss
        self.loss_total += loss

    @property
    def moving_average(self) -> float:
        return self.loss_total / len(self.loss_list)


def compute_loss(s: Session, batch: dict[str, Any]) -> torch.Tensor:
    model = s.model
    if "latents" in batch:
        latents = batch["latents"].float()
    else:
        with torch.no_grad():
            latents = model.vae.encode(batch["image"])
    captions: list[str] = batch["captions"]
    if "te_hidden" in batch:
        hidden, mask = batch["te_hidden"].float(), batch["te_mask"].float()
    elif s.caption_cache is not None:
        hidden = torch.stack([s.caption_cache[c][0] for c in captions])
        mask = torch.stack([s.caption_cache[c][1] for c in captions])
    else:
        assert model.text_encoder is not None
        hidden, mask = model.text_encoder.encode_texts(captions)
    noisy, t, target = s.arch.noisy_input(latents)
    # fp16 is run as bf16: CPU autocast has no useful fp16 path
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=s.autocast):
        pred = model.unet(noisy, t, hidden, mask)
    return F.mse_loss(pred.float(), target.float())


def _print_summary(s: Session, num_batches: int, num_epochs: int) -> None:
    args = s.args
    print("running training / 学習開始")
    print(f"  num train images * repeats / 学習画像の数×繰り返し回数: {len(s.entries)}")
    print("  num validation images * repeats / 学習画像の数×繰り返し回数: 0")
    print("  num reg images / 正則化画像の数: 0")
    print(f"  num batches per epoch / 1epochのバッチ数: {num_batches}")
    print(f"  num epochs / epoch数: {num_epochs}")
    print(f"  batch size per device / バッチサイズ: {args.train_batch_size}")
    print(f"  gradient accumulation steps / 勾配を合計するステップ数 = {args.gradient_accumulation_steps}")
    print(f"  total optimization steps / 学習ステップ数: {args.max_train_steps}")


def _initial_step(args: argparse.Namespace, steps_from_state: int | None) -> int:
    initial_step = 0
    if args.initial_step is not None:
        if steps_from_state is not None:
            logger.warning(
                "steps from the state is ignored because initial_step is specified"
                " / initial_stepが指定されているため、stateからのステップ数は無視されます"
            )
        initial_step = args.initial_step
    elif steps_from_state is not None:
        initial_step = steps_from_state
    if initial_step > 0:
        assert args.max_train_steps > initial_step, (
            "max_train_steps should be greater than initial step / "
            "max_train_stepsは初期ステップより大きい必要があります:"
            f" {args.max_train_steps} vs {initial_step}"
        )
    return initial_step


class Trainer:
    def __init__(self, s: Session) -> None:
        self.s = s
        self.args = s.args
        self.output_dir = Path(s.args.output_dir)

    def save_weights(self, name: str, steps: int, epoch: int) -> None:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        path = self.output_dir / name
        print(f"\nsaving checkpoint: {path}")
        metadata = {
            "ss_output_name": str(self.args.output_name),
            "ss_network_module": str(self.args.network_module),
            "ss_network_dim": str(self.args.network_dim),
            "ss_network_alpha": str(self.args.network_alpha),
            "ss_seed": str(self.args.seed),
            "ss_steps": str(steps),
            "ss_epoch": str(epoch),
            "ss_base_model_version": self.s.arch.name,
        }
        # Every save of real sd-scripts asks git for a commit hash for the model card, and outside a
        # checkout git's own error reaches stderr before kohya's warning.
        print("fatal: not a git repository (or any of the parent directories): .git", file=sys.stderr, flush=True)
        log_as("sai_model_spec.py", 288, "Failed to get git commit hash, using fallback", logging.WARNING)
        self.s.network.save_weights(path, metadata)

    def save_state(self, dir_name: str, epoch: int, step: int) -> None:
        s = self.s
        save_state(self.output_dir / dir_name, s.network, s.optimizer, s.scheduler, s.scaler_state, epoch, step,
                   pause=lambda gaps: faults.pace_save(s.sim, gaps))

    def run(self) -> None:
        s, args = self.s, self.args
        steps_from_state = None
        if args.resume:
            logger.info(f"resume training from local state: {args.resume}")
            fp16 = args.mixed_precision == "fp16"
            steps_from_state, scaler_state = load_state(Path(args.resume), s.network, s.optimizer, s.scheduler, fp16)
            if scaler_state is not None:
                s.scaler_state = scaler_state

        ga = args.gradient_accumulation_steps
        num_batches = len(s.dataloader)
        num_update_steps_per_epoch = math.ceil(num_batches / ga)
        num_train_epochs = math.ceil(args.max_train_steps / num_update_steps_per_epoch)
        _print_summary(s, num_batches, num_train_epochs)

        initial_step = _initial_step(args, steps_from_state)
        epoch_to_start = 0
        if initial_step > 0:
            if args.skip_until_initial_step:
                if not args.resume:
                    logger.info(
                        "initial_step is specified but not resuming. lr scheduler will be started from the beginning"
                        " / initial_stepが指定されていますがresumeしていないため、lr schedulerは最初から始まります"
                    )
                logger.info(f"skipping {initial_step} steps / {initial_step}ステップをスキップします")
                initial_step *= ga
                epoch_to_start = initial_step // num_update_steps_per_epoch
            else:
                # kohya only moves the epoch number; the saved epoch is trained again from its start
                epoch_to_start = initial_step // num_update_steps_per_epoch
                initial_step = 0
        global_step = 0
        if initial_step > 0:
            for skip_epoch in range(epoch_to_start):
                logger.info(f"skipping epoch {skip_epoch + 1} because initial_step (multiplied) is {initial_step}")
                initial_step -= num_batches
            # the step counter restarts at the position inside the epoch: labels after resume are wrong
            global_step = initial_step

        # For --sample_at_first: before training, at global step 0 (named as epoch 0, as kohya does)
        self._sample(0, 0)
        unet_dtype = next(s.model.unet.parameters()).dtype
        logger.info(f"unet dtype: {unet_dtype}, device: cpu")
        bar = ProgressBar(args.max_train_steps - initial_step, desc="steps")
        global_step, current_epoch = self._loop(
            bar, global_step, initial_step, epoch_to_start, num_train_epochs, num_batches
        )

        if args.save_state:
            logger.info("")
            logger.info("saving last state.")
            self.save_state(last_state_name(args.output_name), current_epoch, global_step)
        self.save_weights(last_weights_name(args.output_name), global_step, num_train_epochs)
        logger.info("model saved.")
        bar.close()

    def _loop(
        self, bar: ProgressBar, global_step: int, initial_step: int, epoch_to_start: int,
        num_train_epochs: int, num_batches: int,
    ) -> tuple[int, int]:
        """The epoch loop; returns (global_step, current epoch) where kohya's state hook reads them."""
        s, args = self.s, self.args
        ga = args.gradient_accumulation_steps
        loss_recorder = LossRecorder()
        current_epoch = 0  # stays 0 when every epoch was skipped, as in kohya
        for epoch in range(epoch_to_start, num_train_epochs):
            print(f"\nepoch {epoch + 1}/{num_train_epochs}\n")
            current_epoch = epoch + 1
            s.sampler.set_epoch(current_epoch)
            s.network.train()
            # kohya skips initial_step-1 batches in the loader and one more in the loop,
            # so its loop index restarts at 0 at the first skipped-to batch
            skip, index_offset = initial_step, max(initial_step - 1, 0)
            initial_step = 0
            accumulated = 0
            for batch_index, batch in enumerate(s.dataloader):
                step = batch_index - index_offset
                if skip > 0:
                    skip -= 1
                    continue
                faults.at_step(s.sim, global_step + 1, bool(args.gradient_checkpointing))
                loss = compute_loss(s, batch)
                (loss / ga).backward()
                accumulated += 1
                # accelerate syncs every `ga` batches and always at the end of the dataloader
                if accumulated % ga == 0 or batch_index == num_batches - 1:
                    s.optimizer.step()
                    s.scheduler.step()
                    s.optimizer.zero_grad(set_to_none=True)
                    accumulated = 0
                    bar.update(1)
                    global_step += 1
                    self._after_optimizer_step(global_step, current_epoch)
                loss_recorder.add(epoch=epoch, step=step, loss=loss.detach().item())
                bar.set_postfix(avr_loss=loss_recorder.moving_average)
                if global_step >= args.max_train_steps:
                    break
            if args.save_every_n_epochs is not None:
                saving = (epoch + 1) % args.save_every_n_epochs == 0 and (epoch + 1) < num_train_epochs
                if saving:
                    self.save_weights(epoch_weights_name(args.output_name, epoch + 1), global_step, epoch + 1)
                    if args.save_state:
                        logger.info("")
                        logger.info(f"saving state at epoch {epoch + 1}")
                        self.save_state(epoch_state_name(args.output_name, epoch + 1), epoch + 1, global_step)
            self._sample(epoch + 1, global_step)  # an epoch's samples come after its save
            if global_step >= args.max_train_steps:
                break
        return global_step, current_epoch

    def _sample(self, epoch: int | None, global_step: int) -> None:
        """kohya's sample_images: ``epoch`` None within an epoch, its number at its end, 0 at first."""
        s = self.s
        if s.sample_writer is not None and s.sample_writer.due(self.args, epoch, global_step):
            s.network.eval()
            s.sample_writer.sample(global_step, s.model.unet, s.model.vae, s.model.text_encoder, s.latents_cached,
                                   epoch)
            s.network.train()

    def _after_optimizer_step(self, global_step: int, current_epoch: int) -> None:
        s, args = self.s, self.args
        # samples come before the save of the same step: a crash here loses that step's state
        self._sample(None, global_step)
        if args.save_every_n_steps is not None and global_step % args.save_every_n_steps == 0:
            self.save_weights(step_weights_name(args.output_name, global_step), global_step, current_epoch)
            if args.save_state:
                logger.info("")
                logger.info(f"saving state at step {global_step}")
                self.save_state(step_state_name(args.output_name, global_step), current_epoch, global_step)
        faults.pace(s.sim)


def train(arch: Arch, args: argparse.Namespace) -> int:
    """Run one training from parsed arguments; returns the exit status (exceptions propagate)."""
    # one thread: bit-identical results across runs and resumes
    torch.set_num_threads(1)
    sim = faults.from_env()
    sim.once_dir = Path(args.output_dir)
    session = prepare(args, arch, sim)
    if session is None:
        return 0
    Trainer(session).run()
    return 0
