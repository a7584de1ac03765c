"""Injected into both ranks of the collective-timeout test through PYTHONPATH (nothing else imports it).

1. The fault: rank 0 alone is slow in a phase only it works in. ``TRAINSUP_TEST_SLOW_SAVE_S`` seconds of sleep
   at the start of each of its checkpoint saves (``Trainer._save_checkpoint``), as a big checkpoint written by
   rank 0 while the other ranks wait in the next collective would take; rank 1 is untouched.
2. The Trainer's ``--ddp_timeout`` given to the process group. transformers hands ``ddp_timeout`` to the
   process group on every path except ``--use_cpu`` (5.x, ``TrainingArguments._setup_devices``: its CPU
   branch passes the backend only, so gloo ranks keep torch's 30 minutes). The setting is read from the
   rank's own command line, so a relaunch with a raised ``--ddp_timeout`` is a longer timeout here too, as it
   is for ranks on GPUs.
"""

import os
import sys
import time

if os.environ.get("RANK") == "0" and os.environ.get("TRAINSUP_TEST_SLOW_SAVE_S"):
    import transformers.trainer as _trainer

    _save = _trainer.Trainer._save_checkpoint
    _slow = float(os.environ["TRAINSUP_TEST_SLOW_SAVE_S"])

    def _slow_save(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(_slow)
        return _save(self, *args, **kwargs)

    _trainer.Trainer._save_checkpoint = _slow_save

if os.environ.get("RANK") is not None and "--ddp_timeout" in sys.argv:
    import datetime

    import torch.distributed as _dist

    _timeout = datetime.timedelta(seconds=float(sys.argv[sys.argv.index("--ddp_timeout") + 1]))
    _init = _dist.init_process_group

    def _init_with_timeout(*args, **kwargs):  # type: ignore[no-untyped-def]
        kwargs["timeout"] = _timeout
        return _init(*args, **kwargs)

    _dist.init_process_group = _init_with_timeout
