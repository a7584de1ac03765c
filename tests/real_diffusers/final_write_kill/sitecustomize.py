"""Loaded at start-up by every Python process of the bed's command (this folder is put first on PYTHONPATH):
in the training process only (``train_text_to_image_lora.py``), the first write of the final LoRA straight
into the output directory is killed half-way, as a SIGKILL inside safetensors' own write leaves it.

safetensors 0.8 writes ``DIR/.tmpXXXXXX`` and renames it over the real name when done (the bed's README,
strace); this writes half of the same bytes under such a name and SIGKILLs its own process. The write is
killed once: ``TRAINSUP_TEST_KILL_FINAL_MARK`` (a file) is created first, and a later attempt saves as usual.
``TRAINSUP_TEST_KILL_FINAL_OUT``: the output directory (the checkpoints' own LoRA files are left alone).
"""

import os
import sys

_OUT = os.environ.get("TRAINSUP_TEST_KILL_FINAL_OUT")
_MARK = os.environ.get("TRAINSUP_TEST_KILL_FINAL_MARK")

if _OUT and _MARK and sys.argv and os.path.basename(sys.argv[0]) == "train_text_to_image_lora.py":
    import random
    import signal
    import string

    import safetensors.torch

    _real_save_file = safetensors.torch.save_file

    def _save_file(tensors, filename, metadata=None):  # type: ignore[no-untyped-def]
        target = os.path.abspath(str(filename))
        if os.path.dirname(target) == os.path.abspath(_OUT) and not os.path.exists(_MARK):
            with open(_MARK, "w"):
                pass
            data = safetensors.torch.save(tensors, metadata=metadata)
            name = ".tmp" + "".join(random.choices(string.ascii_letters + string.digits, k=6))
            with open(os.path.join(os.path.dirname(target), name), "wb") as half:
                half.write(data[: len(data) // 2])
                half.flush()
            print(f"test shim: killed inside the write of {target} (as {name})", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return _real_save_file(tensors, filename, metadata=metadata)

    safetensors.torch.save_file = _save_file
