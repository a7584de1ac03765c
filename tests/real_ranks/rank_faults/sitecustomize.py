"""Injected into the ranks of the real ranks tiers through PYTHONPATH (nothing else imports it); each part acts
only when its variable is set, and only in a process that is a rank (``RANK`` set by the launcher).

1. A rank-0-only phase made slow (``TRAINSUP_TEST_SLOW_SAVE_S`` seconds of sleep, rank 0 only): the Hugging
   Face Trainer's checkpoint saves (``Trainer._save_checkpoint``, each); sd-scripts' first weights file
   (``safetensors.torch.save_file``, which sd-scripts calls on rank 0 alone while rank 1 goes on into the next
   step's gradient all-reduce). As a big checkpoint, a sample or a validation pass on rank 0 would take.
   LitGPT: the first ``torch.save`` of rank 0 (its LoRA checkpoint: rank 0 writes it alone while rank 1 goes on
   into the next step); LitGPT's ranks have no ``RANK`` when they start, so the rank is asked of
   ``torch.distributed`` when it saves.
2. The trainer's ``--ddp_timeout`` given to the process group, in ``TRAINSUP_TEST_DDP_TIMEOUT_UNIT_S``
   seconds (1: the HF Trainer's seconds; 60: sd-scripts' minutes). Both trainers hand it to the process group
   on GPUs and drop it on the CPU: transformers 5.x's ``--use_cpu`` branch of ``_setup_devices`` passes the
   backend only; sd-scripts builds its ``InitProcessGroupKwargs`` only when ``torch.cuda.device_count() > 1``.
   The value is read from the rank's own command line, so a relaunch with a raised ``--ddp_timeout`` is a
   longer timeout here too, as it is for ranks on GPUs.
   ``TRAINSUP_TEST_PG_TIMEOUT_S``: the process group's timeout in seconds, for a trainer that has no setting of
   its own (LitGPT), standing in for torch's default (10 or 30 minutes), which a test cannot wait for.
3. A rank that fails on its own (``TRAINSUP_TEST_FAIL_AT="RANK:STEP"``): that rank's optimizer raises a
   ValueError at that step, as a bad sample on one GPU would; the other ranks are left waiting in their next
   collective.
"""

import os
import sys
import time

RANK = os.environ.get("RANK")

if RANK == "0" and os.environ.get("TRAINSUP_TEST_SLOW_SAVE_S"):
    _slow = float(os.environ["TRAINSUP_TEST_SLOW_SAVE_S"])
    if any(a.endswith("sft.py") for a in sys.argv):
        import transformers.trainer as _trainer

        _save = _trainer.Trainer._save_checkpoint

        def _slow_save(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            time.sleep(_slow)
            return _save(self, *args, **kwargs)

        _trainer.Trainer._save_checkpoint = _slow_save
    else:
        import safetensors.torch as _st

        _save_file = _st.save_file
        _slept = []

        def _slow_save_file(*args, **kwargs):  # type: ignore[no-untyped-def]
            if not _slept:
                _slept.append(True)
                print(f"rank 0: the first weights file takes {_slow:g} s more", flush=True)
                time.sleep(_slow)
            return _save_file(*args, **kwargs)

        _st.save_file = _slow_save_file

if os.environ.get("TRAINSUP_TEST_SLOW_SAVE_S") and os.path.basename(sys.argv[0] if sys.argv else "") == "litgpt":
    import torch as _torch

    _torch_save = _torch.save
    _late = float(os.environ["TRAINSUP_TEST_SLOW_SAVE_S"])
    _late_done = []

    def _slow_torch_save(*args, **kwargs):  # type: ignore[no-untyped-def]
        import torch.distributed as _d

        if not _late_done and _d.is_initialized() and _d.get_rank() == 0:
            _late_done.append(True)
            print(f"rank 0: its first checkpoint takes {_late:g} s more", flush=True)
            time.sleep(_late)
        return _torch_save(*args, **kwargs)

    _torch.save = _slow_torch_save

if os.environ.get("TRAINSUP_TEST_PG_TIMEOUT_S"):
    import datetime

    import torch.distributed as _pg

    _pg_timeout = datetime.timedelta(seconds=float(os.environ["TRAINSUP_TEST_PG_TIMEOUT_S"]))
    _pg_init = _pg.init_process_group

    def _init_with_test_timeout(*args, **kwargs):  # type: ignore[no-untyped-def]
        kwargs["timeout"] = _pg_timeout
        return _pg_init(*args, **kwargs)

    _pg.init_process_group = _init_with_test_timeout

if RANK is not None and "--ddp_timeout" in sys.argv:
    import datetime

    import torch.distributed as _dist

    _unit = float(os.environ.get("TRAINSUP_TEST_DDP_TIMEOUT_UNIT_S", "1"))
    _timeout = datetime.timedelta(seconds=float(sys.argv[sys.argv.index("--ddp_timeout") + 1]) * _unit)
    _init = _dist.init_process_group

    def _init_with_timeout(*args, **kwargs):  # type: ignore[no-untyped-def]
        kwargs["timeout"] = _timeout
        return _init(*args, **kwargs)

    _dist.init_process_group = _init_with_timeout

if RANK is not None and os.environ.get("TRAINSUP_TEST_FAIL_AT", "").split(":")[0] == RANK:
    import torch.optim as _optim

    _fail_at = int(os.environ["TRAINSUP_TEST_FAIL_AT"].split(":")[1])
    _step = _optim.AdamW.step
    _steps = []

    def _failing_step(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        _steps.append(1)
        if len(_steps) == _fail_at:
            raise ValueError(f"rank {RANK}: a sample this rank cannot train on, at step {_fail_at}")
        return _step(self, *args, **kwargs)

    _optim.AdamW.step = _failing_step
