"""A trainer of its own shape (not kohya's, not LitGPT's), for the command and declarative adapters.

    python own_shape_trainer.py --out DIR --steps N --every K [--from STATE_DIR]

It trains N steps of a deterministic toy "weight" (so a resumed run ends with exactly the weight of
an uninterrupted one), prints ``[step S/N] loss=L`` per step, saves ``DIR/ckpt-S/`` every K steps
(``weight.json`` first, then, 0.2 s later, ``done.marker``: a kill in between leaves a partial
state), resumes from ``--from``, writes ``DIR/final.json`` and prints ``all done``.
``OWN_SHAPE_DIE_IN_SAVE=S`` dies (exit 1) half-way through the save of step S, once: it leaves
``DIR/.died`` so that the next launch saves normally.
``DIR/final.json`` is written as safetensors writes a file: a ``DIR/.tmpXXXXXX`` (random), then a
rename. ``OWN_SHAPE_KILLED_IN_FINAL=1`` kills itself (SIGKILL) half-way through that write, once
(``DIR/.died`` again): the temporary file stays behind, as a real trainer's would.
``OWN_SHAPE_OOM_AT=S`` runs out of (simulated) GPU memory at step S, printing torch's message and
exiting 1, unless ``PYTORCH_CUDA_ALLOC_CONF`` has ``expandable_segments:True`` (the allocator
setting trainsup's first ``cuda_oom`` rung sets): a fault a remedy fixes through the environment.
"""

import argparse
import json
import os
import random
import signal
import string
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--every", type=int, required=True)
parser.add_argument("--from", dest="resume")
parser.add_argument("--step-seconds", type=float, default=0.05)
args = parser.parse_args()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)

step, weight = 0, 1.0
if args.resume:
    state = json.loads((Path(args.resume) / "weight.json").read_text())
    step, weight = state["step"], state["weight"]
    print(f"resuming from {args.resume} at step {step}", flush=True)

die_at = int(os.environ.get("OWN_SHAPE_DIE_IN_SAVE", "0"))
oom_at = int(os.environ.get("OWN_SHAPE_OOM_AT", "0"))
expandable = "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
while step < args.steps:
    time.sleep(args.step_seconds)
    step += 1
    if step == oom_at and not expandable:
        print("Traceback (most recent call last):\n  File \"own_shape_trainer.py\", line 1, in <module>\n"
              "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
              "capacity of 23.55 GiB of which 1.12 GiB is free.", file=sys.stderr, flush=True)
        sys.exit(1)
    weight = weight * 0.97 + step * 1e-3  # depends on every step before it, in order
    print(f"[step {step}/{args.steps}] loss={weight:.6f}", flush=True)
    if step % args.every == 0:
        ckpt = out / f"ckpt-{step}"
        ckpt.mkdir(exist_ok=True)
        (ckpt / "weight.json").write_text(json.dumps({"step": step, "weight": weight}))
        if step == die_at and not (out / ".died").exists():
            (out / ".died").write_text("")
            print("Traceback (most recent call last):\nRuntimeError: the save broke half-way", file=sys.stderr)
            sys.exit(1)
        time.sleep(0.2)
        (ckpt / "done.marker").write_text("")
final = json.dumps({"step": step, "weight": weight})
tmp = out / (".tmp" + "".join(random.choices(string.ascii_letters + string.digits, k=6)))
with open(tmp, "w") as f:
    f.write(final[:len(final) // 2])
    f.flush()
    if os.environ.get("OWN_SHAPE_KILLED_IN_FINAL") == "1" and not (out / ".died").exists():
        (out / ".died").write_text("")
        os.kill(os.getpid(), signal.SIGKILL)
    f.write(final[len(final) // 2:])
os.replace(tmp, out / "final.json")
print("all done", flush=True)
