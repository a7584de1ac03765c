"""Benchmark child: writes N MB of kohya-like output (log lines on stdout, `\\r` bar updates on stderr).

Usage: python flood_child.py MEGABYTES [ignored kohya flags...]
"""

import sys

target = int(sys.argv[1]) * 1_000_000
out, err = sys.stdout, sys.stderr
info = ("2026-11-21 10:00:00 INFO     caching latents for bucket 3 of 17, {n} images done"
        "                    train_util.py:1234\n")
warn = "/x/site-packages/torch/utils/checkpoint.py:90: UserWarning: None of the inputs have requires_grad=True\n"
written = 0
n = 0
total = 100_000
while written < target:
    n += 1
    line = (f"\rsteps: {n * 100 // total:3d}%|████      | {n}/{total} "
            f"[01:23<12:27,  1.20it/s, avr_loss=0.{n % 1000:03d}]")
    err.write(line)
    written += len(line)
    if n % 3 == 0:
        s = info.format(n=n)
        out.write(s)
        written += len(s)
    if n % 50 == 0:
        err.write(warn)
        written += len(warn)
out.write("epoch 1/1\n")
err.write("\nmodel saved.\n")
