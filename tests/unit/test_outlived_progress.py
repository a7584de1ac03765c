"""Evidence that later progress outlived is dropped for every trainer, from its adapter's own progress
parser (issue 30): not only kohya's ``steps`` bar, but LitGPT's ``iter`` lines and OneTrainer's ``step`` bar."""

from __future__ import annotations

import io

from trainsup.adapters.litgpt.output import LitOutput
from trainsup.adapters.onetrainer.output import OTOutput
from trainsup.faults.logscan import scan_log
from trainsup.faults.progress import ProgressFormat
from trainsup.faults.rules import BUILTIN_RULES
from trainsup.faults.scanner import FaultScanner
from trainsup.trainers.registry import known_output

# A first cause: only the trainer's own progress outlives it (another rank's bars do not).
OOM = ["Traceback (most recent call last):", '  File "train.py", line 9, in <module>',
       "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]


def lit(step: int) -> str:
    return f"Epoch 1 | iter {step} step {step} | loss train: 6.148, val: n/a | iter time: 14.83 ms (step)"


def ot(step: int) -> str:
    return f"step: {step * 10}%|███       | {step}/10 [00:0{step}<00:05,  1.00it/s, loss=0.5, smooth loss=0.5]"


def verdict(lines: list[str], progress: ProgressFormat | None) -> str | None:
    scanner = FaultScanner(BUILTIN_RULES, progress)
    for n, line in enumerate(lines, 1):
        scanner.feed(line, n)
    found = scanner.verdict
    return None if found is None else found.fault


def test_litgpt_iterations_after_an_oom_drop_it_and_without_them_it_stands() -> None:
    went_on = [lit(3), *OOM, lit(4), lit(5), "Final evaluation | val loss: 6.1"]
    assert verdict(went_on, None) == "cuda_oom"  # no parser: only a kohya bar could have outlived it
    assert verdict(went_on, LitOutput()) is None
    assert verdict([lit(3), *OOM, lit(4)], LitOutput()) == "cuda_oom"  # one step on may be the last print
    assert verdict([lit(3), *OOM], LitOutput()) == "cuda_oom"


def test_onetrainer_step_bars_after_an_oom_drop_it_and_without_them_it_stands() -> None:
    went_on = [ot(3), *OOM, ot(4), ot(5), "Saving workspace/model.safetensors"]
    assert verdict(went_on, None) == "cuda_oom"
    assert verdict(went_on, OTOutput()) is None
    assert verdict([ot(3), *OOM, ot(4)], OTOutput()) == "cuda_oom"


def test_diagnose_reads_any_known_trainers_progress() -> None:
    for log in ([lit(3), *OOM, lit(4), lit(5)], [ot(3), *OOM, ot(4), ot(5)]):
        raw = "\n".join(log).encode() + b"\n"
        assert scan_log(io.BytesIO(raw)).verdict is not None  # no format given: the evidence stands
        assert scan_log(io.BytesIO(raw), progress=known_output()).verdict is None
