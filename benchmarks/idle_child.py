"""Benchmark child: a trainer that only waits (prints a `steps` bar each second) for SECONDS.

Usage: python idle_child.py SECONDS [ignored kohya flags...]
"""

import sys
import time

end = time.monotonic() + float(sys.argv[1])
n = 0
while time.monotonic() < end:
    n += 1
    sys.stderr.write(f"\rsteps:   0%|          | {n}/100000 [00:{n:02d}<99:99,  1.00it/s, avr_loss=0.5]")
    sys.stderr.flush()
    time.sleep(1)
sys.stderr.write("\nmodel saved.\n")
