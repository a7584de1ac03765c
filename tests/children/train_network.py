"""A small stand-in for a kohya script without torch (named train_network.py so trainsup takes it for
sd-scripts), for process-behaviour tests. Ignores the flags it gets.

Modes (first argument): longline N_MB | binary N_MB | fail MESSAGE | crash MESSAGE | hang PIDFILE | ok
| warned ok|killed (an import-time warning naming a missing module, two steps, then success or SIGKILL)
| tree PIDFILE (a child and a grandchild in a session of its own, all three deaf to SIGTERM)
It speaks kohya's formats: the `steps` bar with \\r, and `model saved.` on success.
"""

import os
import signal
import subprocess
import sys
import time

mode = sys.argv[1]
out = sys.stdout.buffer


def bar(n, total=4):
    sys.stderr.write(f"\rsteps: {n * 100 // total:3d}%|#   | {n}/{total} [00:01<00:01,  2.00it/s, avr_loss=0.5]")
    sys.stderr.flush()


if mode == "longline":
    block = b"x" * (1 << 20)
    for _ in range(int(sys.argv[2])):
        out.write(block)
    out.write(b"\n")
elif mode == "binary":
    with open("/dev/urandom", "rb") as rnd:
        for _ in range(int(sys.argv[2])):
            out.write(rnd.read(1 << 20))
    out.write(b"\n")
elif mode == "fail":
    bar(1)
    sys.stderr.write("\nTraceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n")
    sys.stderr.write(f"RuntimeError: {sys.argv[2]}\n")
    sys.exit(1)
elif mode == "crash":
    sys.stderr.write(f"RuntimeError: {sys.argv[2]}\n")
    sys.exit(1)
elif mode == "warned":
    sys.stderr.write("Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'. "
                     "Please make sure you already `pip install kernels` and the kernels >= 0.11.1\n")
    bar(1)
    bar(2)
    if sys.argv[2] == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
elif mode == "hang":
    # A launcher-like parent that ignores SIGTERM, with a grandchild that ignores it too.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ignore_term = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    grandchild = subprocess.Popen([sys.executable, "-c", ignore_term])
    with open(sys.argv[2], "w") as fh:
        fh.write(f"{os.getpid()} {grandchild.pid}\n")
    bar(1)
    time.sleep(600)
    sys.exit(0)
elif mode == "tree":
    # A trainer that is a tree deaf to SIGTERM (a launcher and its workers may be): a child, and the
    # child's child in a session of its own. PIDFILE gets "TRAINER CHILD GRANDCHILD" once all are up.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited through fork and exec by both
    sleeper = "import time; time.sleep(600)"
    starter = ("import subprocess, sys, time; "
               f"g = subprocess.Popen([sys.executable, '-c', {sleeper!r}], start_new_session=True); "
               "print(g.pid, flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    grandchild = int(child.stdout.readline())
    with open(sys.argv[2] + ".tmp", "w") as fh:
        fh.write(f"{os.getpid()} {child.pid} {grandchild}\n")
    os.rename(sys.argv[2] + ".tmp", sys.argv[2])
    bar(1)
    time.sleep(600)
    sys.exit(0)
out.flush()
bar(4)
sys.stderr.write("\nmodel saved.\n")
