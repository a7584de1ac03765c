"""Benchmark: how much slower is `trainsup diagnose` than merely iterating a log's lines?

Writes a realistic kohya-like log of about 1 GB into a temporary directory, then times, in one run,
(a) a plain Python loop over the file's lines, ``for line in open(f, 'rb'): pass``, and
(b) ``trainsup diagnose`` on the same file, each as its own ``python`` process (so both pay an
interpreter start), the page cache warmed first, and prints the ratio b/a (the issue's bound is 2; it was 4).

    python benchmarks/diagnose.py [--mb 1024] [--reps 3] [--keep FILE]

``--keep FILE`` writes the log there and keeps it; when FILE already exists it is reused as is.

The log follows what sd-scripts prints for a Flux LoRA run without ``COLUMNS`` set (rich wraps at
80 columns): a start-up block with accelerate's defaults warning, wrapped INFO records and library
warnings, a latent-caching bar; then training where tqdm redraws the ``steps`` bar with ``\\r`` twice
a step (``update`` and ``set_postfix``), padding with spaces when the bar got shorter; every 500
steps a state save (its INFO record glued to the bar, as in a captured log) and two sample images
with their own bar; ``epoch N/M`` every 1000 steps; and, near the end, a CUDA out-of-memory
traceback glued to the bar, followed by accelerate's ``CalledProcessError``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS_PER_EPOCH = 1000
SAVE_EVERY = 500
TOTAL = 10_000_000  # the run's advertised --max_train_steps; the log ends long before

HEADER = """The following values were not passed to `accelerate launch` and had defaults used instead:
\t`--num_processes` was set to a value of `1`
\t`--num_machines` was set to a value of `1`
\t`--mixed_precision` was set to a value of `'no'`
\t`--dynamo_backend` was set to a value of `'no'`
To avoid this warning pass in values for each of the problematic parameters or run `accelerate config`.
2024-08-01 12:00:05 INFO     Loading settings from          train_network.py:331
                             /work/cfg/flux_lora.toml...                        
                    INFO     /work/cfg/flux_lora            train_network.py:332
2024-08-01 12:00:06 INFO     prepare images.                  config_util.py:589
                    INFO     found directory                  train_util.py:1926
                             /data/train/10_character                           
                             contains 40 image files                            
/venv/lib/python3.10/site-packages/xformers/ops/fmha/flash.py:211: FutureWarning: `torch.library.impl_abstract` was \
renamed to `torch.library.register_fake`. Please use that instead; we will remove `torch.library.impl_abstract` in a \
future version of PyTorch.
  @torch.library.impl_abstract("xformers_flash::flash_fwd")
2024-08-01 12:00:08 INFO     Loading state dict from           flux_utils.py:169
                             /models/flux1-dev.safetensors                      
2024-08-01 12:00:09 INFO     Loaded Flux: <All keys matched    flux_utils.py:171
                             successfully>                                      
                    INFO     caching latents...               train_util.py:1044
"""

SUMMARY = """running training / 学習開始
  num train images * repeats / 学習画像の数×繰り返し回数: 400
  num reg images / 正則化画像の数: 0
  num batches per epoch / 1epochのバッチ数: 1000
  num epochs / epoch数: 10000
  batch size per device / バッチサイズ: 1
  gradient accumulation steps / 勾配を合計するステップ数 = 1
  total optimization steps / 学習ステップ数: 10000000
/venv/lib/python3.10/site-packages/torch/utils/checkpoint.py:91: UserWarning: None of the inputs have \
requires_grad=True. Gradients will be None
  warnings.warn(
"""

SAVE = """2024-08-01 13:{m:02d}:{s:02d} INFO     saving state at step {step}          train_util.py:5123
                    INFO     Saving current state to         accelerator.py:3022
                             /out/lora-step{step:08d}-state                       
                    INFO     Optimizer state saved in       checkpointing.py:107
                             /out/lora-step{step:08d}-state/o                     
                             ptimizer.bin                                       
                    INFO     Scheduler state saved in       checkpointing.py:121
                             /out/lora-step{step:08d}-state/s                     
                             cheduler.bin                                       
                    INFO     Random states saved in         checkpointing.py:158
                             /out/lora-step{step:08d}-state/r                     
                             andom_states_0.pkl                                 
saving checkpoint: /out/lora-step{step:08d}.safetensors
"""

SAMPLE = """2024-08-01 13:{m:02d}:{s:02d} INFO     generating sample images at step / train_util.py:5631
                             サンプル画像生成 ステップ: {step}                          
                    INFO     prompt: a photo of sks character,  train_util.py:5700
                             standing in a field                                
                    INFO     height: 1024                     train_util.py:5702
                    INFO     width: 1024                      train_util.py:5703
                    INFO     sample_steps: 20                 train_util.py:5704
"""

TAIL = """Traceback (most recent call last):
  File "/work/sd-scripts/flux_train_network.py", line 519, in <module>
    trainer.train(args)
  File "/work/sd-scripts/train_network.py", line 1264, in train
    accelerator.backward(loss)
  File "/venv/lib/python3.10/site-packages/accelerate/accelerator.py", line 2246, in backward
    loss.backward(**kwargs)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 72.00 MiB. GPU 0 has a total capacity of 23.54 GiB of \
which 17.31 MiB is free. Including non-PyTorch memory, this process has 23.51 GiB memory in use. Of the allocated \
memory 22.87 GiB is allocated by PyTorch, and 203.71 MiB is reserved by PyTorch but unallocated. If reserved but \
unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See \
documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
Traceback (most recent call last):
  File "/venv/bin/accelerate", line 8, in <module>
    sys.exit(main())
  File "/venv/lib/python3.10/site-packages/accelerate/commands/launch.py", line 1174, in launch_command
    simple_launcher(args)
  File "/venv/lib/python3.10/site-packages/accelerate/commands/launch.py", line 769, in simple_launcher
    raise subprocess.CalledProcessError(returncode=process.returncode, cmd=cmd)
subprocess.CalledProcessError: Command '['/venv/bin/python', 'flux_train_network.py', '--config_file', \
'/work/cfg/flux_lora.toml']' returned non-zero exit status 1.
"""


def _bar(desc: str, n: int, total: int, postfix: str = "") -> str:
    pct = n * 100 // total
    filled = n * 10 // total
    bar = "█" * filled + " " * (10 - filled)
    return f"{desc}{pct:3d}%|{bar}| {n}/{total} [01:23<12:27,  1.20it/s{postfix}]"


class _Bars:
    """tqdm's redraw: ``\\r`` + the bar, padded with spaces when it got shorter than the last one."""

    def __init__(self) -> None:
        self.last = 0

    def draw(self, text: str) -> str:
        pad = " " * max(0, self.last - len(text))
        self.last = len(text)
        return "\r" + text + pad


def write_log(path: Path, size: int, seed: int = 0) -> int:
    """Write a kohya-like log of at least ``size`` bytes ending in a CUDA OOM; return its size."""
    rng = random.Random(seed)
    written = 0
    with open(path, "w", encoding="utf-8", newline="") as out:
        out.write(HEADER)
        caching = _Bars()
        out.write("".join(caching.draw(_bar("", i, 400)) for i in range(401)) + "\n")
        out.write(SUMMARY)
        written = out.tell()
        step = 0
        steps = _Bars()
        while written < size:
            parts: list[str] = []
            if step % STEPS_PER_EPOCH == 0:
                parts.append(f"\nepoch {step // STEPS_PER_EPOCH + 1}/10000\n")
            for _ in range(SAVE_EVERY):
                step += 1
                loss = f", avr_loss={rng.uniform(0.05, 0.2):.3g}"
                parts.append(steps.draw(_bar("steps: ", step, TOTAL)))
                parts.append(steps.draw(_bar("steps: ", step, TOTAL, loss)))
            m, s = divmod(step // 7, 60)
            parts.append(SAVE.format(step=step, m=m % 60, s=s))  # glued to the bar, as captured
            for _ in range(2):
                parts.append(SAMPLE.format(step=step, m=m % 60, s=s))
                sampling = _Bars()
                parts.append("".join(sampling.draw(_bar("", i, 20)) for i in range(21)) + "\n")
            steps.last = 0
            chunk = "".join(parts)
            out.write(chunk)
            written += len(chunk.encode("utf-8"))
        out.write(steps.draw(_bar("steps: ", step + 1, TOTAL, ", avr_loss=0.1")) + TAIL)
    return path.stat().st_size


def _timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1024, help="size of the generated log in MiB")
    ap.add_argument("--reps", type=int, default=3, help="timings of each, alternating; medians are compared")
    ap.add_argument("--keep", type=Path, help="write the log here and keep it (reused if it exists)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = args.keep or Path(tmp) / "train.log"
        if log.exists():
            size = log.stat().st_size
            print(f"reusing {log} ({size / 1e6:.0f} MB)", flush=True)
        else:
            t0 = time.perf_counter()
            size = write_log(log, args.mb * 1024 * 1024)
            print(f"wrote {log} ({size / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f}s", flush=True)
        loop = [sys.executable, "-c", f"for line in open({str(log)!r}, 'rb'): pass"]
        diagnose = [sys.executable, "-m", "trainsup.cli", "diagnose", str(log)]
        _timed(loop)  # warm the page cache
        result = subprocess.run(diagnose, capture_output=True, text=True, check=False)
        print(f"diagnose exit {result.returncode}: {result.stdout.splitlines()[0] if result.stdout else ''}")
        base, diag = [], []
        for rep in range(args.reps):
            base.append(_timed(loop))
            diag.append(_timed(diagnose))
            print(f"rep {rep + 1}: line loop {base[-1]:.2f}s  diagnose {diag[-1]:.2f}s  "
                  f"ratio {diag[-1] / base[-1]:.2f}", flush=True)
        ratio = statistics.median(diag) / statistics.median(base)
        print(f"median ratio diagnose/line-loop on {size / 1e6:.0f} MB over {args.reps} reps: {ratio:.2f} "
              f"(line loop {statistics.median(base):.2f}s, diagnose {statistics.median(diag):.2f}s, "
              f"{os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
