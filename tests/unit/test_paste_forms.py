"""Faults read in the forms people paste logs in (issue 22): markdown, rich's boxes and wrapping, prefixes,
launcher tracebacks, tracebacks cut before their exception line, import-time version requirements."""

from __future__ import annotations

import functools
import io

import pytest

from trainsup.commands.diagnose import diagnose_scan
from trainsup.faults import logscan, scanner
from trainsup.faults.dumps import DUMP_RULES
from trainsup.faults.linetext import clean_line, rank_tag
from trainsup.faults.remedies import Action, required_spec, upgrade_spec
from trainsup.faults.rules import BUILTIN_RULES
from trainsup.faults.verdict import Said
from trainsup.trainers.registry import family_rules, known_output

# A log of any trainer is read as ``diagnose`` reads it: with every adapter's output format (its
# progress lines drop evidence training outlived; its success line).
KNOWN = known_output()
scan_log = functools.partial(logscan.scan_log, progress=KNOWN)
classify_text = functools.partial(scanner.classify_text, progress=KNOWN)


OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity of 11.7 GiB"


def fault(lines: list[str]) -> str | None:
    verdict = classify_text(lines)
    return verdict.fault if verdict is not None else None


def tb(*frames: tuple[str, str], code: str = "x = f(y)") -> list[str]:
    out = ["Traceback (most recent call last):"]
    for path, func in frames:
        out += [f'  File "{path}", line 42, in {func}', f"    {code}"]
    return out


# --- markdown ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "expected"), [
    ("> RuntimeError: boom", "RuntimeError: boom"),
    ("> > [rank0]: RuntimeError: boom", "RuntimeError: boom"),
    (">", ""),
    (">>     raise ValueError(x)", "raise ValueError(x)"),
    ("```", ""),
    ("```python", ""),
    ("> ```text", ""),
    ("``` console", ""),
    ("~~~", ""),
    ("```Traceback (most recent call last):", "Traceback (most recent call last):"),
    ("subprocess.CalledProcessError: x```", "subprocess.CalledProcessError: x"),
    ("a > b is fine", "a > b is fine"),
])
def test_quote_markers_and_fences_are_peeled(raw: str, expected: str) -> None:
    assert clean_line(raw) == expected


def test_a_quoted_fenced_traceback_with_prose_around_it() -> None:
    lines = ["I get this every time:", "", "> ```", "> Traceback (most recent call last):",
             '>   File "/home/me/sd/train_network.py", line 900, in train',
             ">     accelerator.backward(loss)", f"> {OOM}", "> ```", "", "any idea?"]
    verdict = classify_text(lines)
    assert verdict is not None and verdict.fault == "cuda_oom" and verdict.anchored


# --- prefixes ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "expected"), [
    ("2024-05-01 10:00:00,123 - INFO - loading model", "loading model"),
    ("2024-05-01 10:00:00,123 - accelerate.utils - ERROR - OSError: x", "OSError: x"),
    ("[2024-09-01 10:00:00] [INFO] [rank0]: RuntimeError: x", "RuntimeError: x"),
    ("[2024-09-01 10:00:00] [ERROR] Traceback (most recent call last):", "Traceback (most recent call last):"),
    ("[2024-11-15 10:23:44.155] [info]  Python process exited", "Python process exited"),
    ("12:01:02-123456 INFO     Executing command", "Executing command"),
    ("2024/05/01 10:00:00 ERROR: OSError: x", "OSError: x"),
    ("\x1b[36m(RayTrainWorker pid=61407, ip=10.0.3.14)\x1b[0m   File \"/t/a.py\", line 3, in f",
     'File "/t/a.py", line 3, in f'),
    ('251: [INFO] File "C:\\fg\\train.py", line 9, in f', 'File "C:\\fg\\train.py", line 9, in f'),
    ("ERROR-prone but fine", "ERROR-prone but fine"),
    ("12:00 is not a time stamp", "12:00 is not a time stamp"),
])
def test_gui_and_logging_prefixes_are_peeled(raw: str, expected: str) -> None:
    assert clean_line(raw) == expected


def test_rank_tags_behind_other_decoration_still_keep_ranks_apart() -> None:
    assert rank_tag("[2024-09-01 10:00:00] [INFO] [rank3]: x") == "3"
    assert rank_tag("> [rank1]: x") == "1"
    assert rank_tag("x [rank2] much later" + " " * 200 + "[rank5]") == "2"


# --- rich's boxed traceback and wrapped records ----------------------------------------------------

def test_richs_boxed_traceback_reads_as_cpythons() -> None:
    assert clean_line("╭──────── Traceback (most recent call last) ────────╮") == "Traceback (most recent call last):"
    assert clean_line("│ D:\\lora\\train_network.py:873 in <module>         │") == \
        'File "D:\\lora\\train_network.py", line 873, in <module>'
    assert clean_line("│ ❱  873 │   trainer.train(args)                     │") == ""
    assert clean_line("│    871 │                                           │") == ""
    assert clean_line("╰───────────────────────────────────────────────────╯") == ""
    lines = ["╭──────── Traceback (most recent call last) ────────╮",
             "│ /w/train_network.py:873 in <module>               │",
             "│                                                   │",
             "│ ❱  873 │   trainer.train(args)                     │",
             "│ /w/train_network.py:691 in train                  │",
             "│ ❱  691 │   accelerator.backward(loss)              │",
             "╰───────────────────────────────────────────────────╯",
             "OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB"]
    verdict = classify_text(lines)
    assert verdict is not None and verdict.fault == "cuda_oom" and verdict.anchored


def test_a_wrapped_message_whose_later_rows_name_a_more_specific_fault() -> None:
    # The first row alone is an ImportError (missing_dependency); the whole message is the serializer.
    rich = ["Traceback (most recent call last):", '  File "/sd/train_network.py", line 3, in <module>',
            "    import transformers",
            "2024-05-01 10:00:00 ERROR    ImportError: safetensors>=0.4.3 is       train_util.py:12",
            "                             required for a normal functioning of this",
            "                             module, but found safetensors==0.4.1."]
    assert fault(rich) == "fp8_serializer"
    terminal = ["ImportError: safetensors>=0.4.3 is requ", "ired for a normal functioning of this module"]
    assert fault(terminal) == "fp8_serializer"


def test_a_terminals_hard_wrap_may_cut_the_very_word_a_rule_keys_on() -> None:
    # Neither row holds a key alone; the first is as wide as a terminal and ends mid-word.
    rest = "not copy out of meta tensor; no data!"
    first = "w " * 38 + "Can"
    assert len(first) == 79 and fault([first, rest]) is None  # not as wide as a terminal: not cut
    wide = "w " * 38 + " Can"
    assert len(wide) == 80 and fault([wide, rest]) == "meta_tensor"


def test_richs_continuation_rows_after_a_traceback_are_not_quoted_code() -> None:
    lines = [*tb(("/sd/train_network.py", "train")),
             "2024-05-01 10:00:00 ERROR    torch.OutOfMemoryError: CUDA out of     train_util.py:12",
             "                             memory. Tried to allocate 20.00 MiB"]
    assert fault(lines) == "cuda_oom"


# --- the trainer's exception over the launcher's ---------------------------------------------------

def test_the_launchers_report_quotes_the_childs_argv_which_is_no_evidence() -> None:
    trainer = [*tb(("D:\\k\\train_network.py", "train")), "ValueError: something odd about the buckets"]
    launcher = tb(("D:\\k\\venv\\Scripts\\accelerate.EXE\\__main__.py", "<module>"),
                  ("D:\\k\\venv\\lib\\site-packages\\accelerate\\commands\\launch.py", "simple_launcher"))
    argv = "['python.exe', 'train_network.py', '--output_dir', 'D:/No such file or directory']"
    ended = f"subprocess.CalledProcessError: Command '{argv}' returned non-zero exit status 1."
    # no rule names the trainer's exception: unknown, shown by the trainer's line, not the launcher's
    verdict = classify_text([*trainer, *launcher, ended])
    assert verdict is not None and (verdict.fault, verdict.line) == ("unknown", trainer[-1])
    killed = f"subprocess.CalledProcessError: Command '{argv}' died with <Signals.SIGKILL: 9>."
    assert fault([*trainer, *launcher, killed]) == "host_oom_killed"  # weak: the child's fate


def test_the_rule_that_matched_explains_the_diagnosis() -> None:
    scan = scan_log(_bytes(["FileNotFoundError: [Errno 2] No such file or directory: '/data/img'"]))
    diagnosis = diagnose_scan("x.log", scan, family_rules() + BUILTIN_RULES)
    assert diagnosis.fault == "config_error" and diagnosis.explanation is not None
    assert "LitGPT" not in diagnosis.explanation  # another rule of the same id, not the one that matched


# --- tracebacks judged by their frames -------------------------------------------------------------

SAMPLING = (("/sd/flux_train_network.py", "sample_images"),
            ("/sd/library/flux_train_utils.py", "sample_image_inference"))


@pytest.mark.parametrize(("lines", "expected"), [
    # cut before the exception line: the code of the innermost frame reads the cache
    (tb(*SAMPLING, code="te = sample_prompts_te_outputs[prompt]"), "te_cache_none"),
    # an exception line that names no fault, in a sampling frame, with rank prefixes
    ([f"[rank1]: {x}" for x in [*tb(*SAMPLING), "TypeError: 'NoneType' object is not iterable"]], "te_cache_none"),
    # the message before the traceback (a GUI prints it first), the traceback cut
    (["!!! Exception during processing !!! cannot unpack non-iterable NoneType object", *tb(*SAMPLING)],
     "te_cache_none"),
    (tb(("/sd/sdxl_train_network.py", "get_text_cond"), code='input_ids2 = batch["input_ids2"].to(dev)'),
     "te_cache_none"),
    (["AttributeError: 'FluxNetworkTrainer' object has no attribute 'sample_prompts_te_outputs'"], "te_cache_none"),
    # a None in a dataset is another bug; sampling frames without any None in sight say nothing
    ([*tb(("/sd/train_network.py", "train"), ("/sd/library/train_util.py", "__getitem__")),
      "TypeError: 'NoneType' object is not subscriptable"], "unknown"),
    (tb(*SAMPLING), None),
    # a save traceback with float8 in sight, cut; and one whose exception line is a full disk
    (["INFO saving dtype torch.float8_e4m3fn", *tb(("/sd/train_network.py", "train"),
                                                  ("/venv/accelerate/accelerator.py", "save_state"),
                                                  ("/venv/safetensors/torch.py", "save_file"))], "fp8_serializer"),
    (["INFO saving dtype torch.float8_e4m3fn", *tb(("/venv/accelerate/accelerator.py", "save_state")),
      "OSError: [Errno 28] No space left on device"], "disk_full"),
])
def test_a_traceback_is_judged_by_its_frames(lines: list[str], expected: str | None) -> None:
    assert fault(lines) == expected


def test_adapters_judge_cut_tracebacks_by_their_own_frames() -> None:
    rules = family_rules() + BUILTIN_RULES
    saver = tb(("C:\\ot\\modules\\modelSaver\\mixin\\LoRASaverMixin.py", "_save"),
               code='raise NotImplementedError(f"Unsupported LoRA output format: {fmt}")')
    schedule = tb(("/venv/torch/optim/lr_scheduler.py", "get_lr"),
                  ("/venv/transformers/optimization.py", "_get_polynomial_decay_schedule_with_warmup_lr_lambda"),
                  code="pct_remaining = 1 - (current_step - num_warmup_steps) / decay_steps")
    for lines, expected in ((saver, "output_format"), (schedule, "lr_schedule")):
        verdict = classify_text(lines, rules)
        assert verdict is not None and verdict.fault == expected


def test_a_hint_in_the_code_an_outer_frame_quotes_says_nothing_of_the_exception() -> None:
    # (issue 22, held-out set) the outer frame passes input_ids2 on; the innermost one, cut, fails elsewhere
    outer = [*tb(("/sd/train_network.py", "train"), ("/sd/library/strategy_sdxl.py", "_get_hidden_states_sdxl"),
                 code="pool2 = self._pool_workaround(te2, out, input_ids2, eos_id)"), "            ^^^^^^^^^^^^^^^^^^^"]
    inner = ['  File "/sd/library/strategy_sdxl.py", line 105, in _pool_workaround',
             "    pooled = te.text_projection(pooled.to(te.text_projection.weight.dtype))"]
    assert fault([*outer, *inner, "", "same here with fp8 base ticked"]) is None
    assert fault([f"> {x}" for x in [*outer, *inner]]) is None  # cut at the end of the paste
    # the innermost frame's own code still counts, whatever follows it (a bar, a note, the end)
    assert fault(outer) == "te_cache_none"
    bar = "steps:  60%|██████    | 1500/2500 [1:31:12<1:00:48,  3.65s/it]"
    assert fault([bar, *outer, bar]) == "te_cache_none"
    # and a hint in the message area judges the frames as before
    assert fault([*outer, *inner, "TypeError: 'NoneType' object is not callable"]) == "te_cache_none"


def test_a_hint_in_quoted_code_is_reported_live_once_its_traceback_grew_no_deeper_frame() -> None:
    from trainsup.faults.scanner import FaultScanner

    scanner = FaultScanner()
    lines = tb(("/sd/sdxl_train_network.py", "get_text_cond"), code='input_ids2 = batch["input_ids2"].to(dev)')
    assert [scanner.feed(x, n) for n, x in enumerate(lines, 1)] == [None] * len(lines)
    settled = scanner.feed("TypeError: 'NoneType' object is not subscriptable", len(lines) + 1)
    assert settled is not None and settled.fault == "te_cache_none" and settled.framed
    assert settled.lineno == len(lines)  # the code line that told


# --- import-time version requirements --------------------------------------------------------------

REQ = "ImportError: {} is required for a normal functioning of this module, but found {}."


def test_the_safetensors_requirement_is_the_serializer_and_its_upgrade_satisfies_it() -> None:
    evidence = REQ.format("safetensors>=0.4.3", "safetensors==0.4.1")
    assert fault([evidence]) == "fp8_serializer"
    assert required_spec(Said(evidence)) == "safetensors>=0.4.3"
    assert upgrade_spec(Action("upgrade", "safetensors>=0.4.2"), Said(evidence)) == "safetensors>=0.4.3"
    low = REQ.format("safetensors>=0.3.1", "safetensors==0.3.0")
    assert upgrade_spec(Action("upgrade", "safetensors>=0.4.2"), Said(low)) == "safetensors>=0.4.2"
    assert upgrade_spec(Action("upgrade", "safetensors>=0.4.2"), Said(None)) == "safetensors>=0.4.2"


def test_another_packages_requirement_stops_with_the_exact_pip_command() -> None:
    evidence = REQ.format("tokenizers>=0.19,<0.20", "tokenizers==0.15.2")
    assert required_spec(Said(evidence)) == "tokenizers>=0.19,<0.20"
    scan = scan_log(_bytes(["Traceback (most recent call last):", '  File "/t/train.py", line 1, in <module>',
                            "    import transformers", evidence]))
    diagnosis = diagnose_scan("x.log", scan, command=["accelerate", "launch", "train_network.py", "--output_dir", "o"])
    assert diagnosis.fault == "missing_dependency"
    assert diagnosis.explanation is not None and "pip install 'tokenizers>=0.19,<0.20'" in diagnosis.explanation
    assert all(r.startswith("stop") for r in diagnosis.remedy) and not diagnosis.command_changed


# --- stack dumps of a hung run (diagnose's rules) --------------------------------------------------

DIAGNOSE_RULES = family_rules() + DUMP_RULES + BUILTIN_RULES


@pytest.mark.parametrize(("lines", "expected"), [
    (["Process 811: python train.py", "", 'Thread 811 (idle): "MainThread"', "    wait (threading.py:320)"], "hang"),
    (["Timeout (0:20:00)!", "Thread 0x00007f00 (most recent call first):"], "hang"),
    (["(gdb) py-bt", "Traceback (most recent call first):"], "hang"),
    ([*tb(("/t/train.py", "train"), ("/usr/lib/python3.10/threading.py", "wait")), "KeyboardInterrupt"], "hang"),
    # Ctrl-C of a healthy run (in computation) or with no frames at all is not a hang: the run was
    # interrupted, and no rule names it
    ([*tb(("/t/train.py", "train"), ("/venv/torch/nn/modules/module.py", "_call_impl")), "KeyboardInterrupt"],
     "unknown"),
    (["KeyboardInterrupt"], "unknown"),
])
def test_stack_dumps_of_a_hung_process_are_a_hang(lines: list[str], expected: str | None) -> None:
    verdict = classify_text(lines, DIAGNOSE_RULES)
    assert (verdict.fault if verdict is not None else None) == expected


# --- what decides that a run failed ----------------------------------------------------------------

def test_a_traceback_cut_above_its_header_still_shows_a_failure() -> None:
    scan = scan_log(_bytes(['  File "/sd/library/unet.py", line 10, in forward', "    h = block(h)"]))
    assert scan.verdict is None and scan.failed


def test_the_bar_tqdm_redraws_as_it_closes_does_not_outlive_the_traceback() -> None:
    bar = "steps:  37%|███▋      | 592/1600 [41:12<1:10:09,  4.18s/it, avr_loss=0.381]"
    lines = [*tb(("/sd/train_network.py", "train")), "RuntimeError: CUDA error: an illegal memory access", bar]
    scan = scan_log(_bytes(lines))
    assert scan.verdict is not None and scan.verdict.fault == "cuda_fatal"
    later = bar.replace("592/1600", "593/1600").replace("37%", "38%")
    scan = scan_log(_bytes([*lines, "saving a sample", later]))
    assert scan.verdict is None  # the run went on past the bar it stood at


def test_a_harmless_traceback_followed_by_progress_is_no_failure() -> None:
    lines = ["A matching Triton is not available, some optimizations will not be enabled",
             *tb(("/venv/xformers/__init__.py", "_is_triton_available")),
             "ModuleNotFoundError: No module named 'triton'",
             "caching: 100%|██████████| 24/24 [00:09<00:00,  2.61it/s]"]
    scan = scan_log(_bytes(lines))
    assert scan.verdict is None and not scan.failed


FP8_LORA = ("ERROR lora diffusion_model.single_blocks.{}.linear1.weight "
            "\"addmm_cuda\" not implemented for 'Float8_e4m3fn'")


def _sampler(step: int, total: int = 20, prefix: str = "") -> str:
    return f"{prefix}{100 * step // total:3d}%|{'#' * step:<20}| {step}/{total} [00:{step:02d}<00:30,  2.98s/it]"


def test_evidence_a_sampler_bar_went_on_past_did_not_end_the_run() -> None:
    # (issue 22, held-out set) ComfyUI logs a failed LoRA patch and samples on to the end
    errors = [FP8_LORA.format(n) for n in range(30, 33)]
    went_on = [_sampler(0) + errors[0], *errors[1:], _sampler(7), _sampler(14), _sampler(20),
               "Prompt executed in 88.41 seconds"]
    assert fault(went_on) is None
    assert fault(went_on[:4]) == "fp8_op_unsupported"  # one step on is not yet the run going on
    scan = scan_log(io.BytesIO(("\r" + _sampler(0) + errors[0] + "\n" + "\n".join(errors[1:]) + "\n"
                                + "".join("\r" + _sampler(n) for n in range(1, 21)) + "\n").encode()))
    assert scan.verdict is None and not scan.failed  # a file's redraws read as a terminal shows them: to its end


def test_a_bar_ticking_once_more_on_another_rank_does_not_outlive_evidence() -> None:
    # rank 1 fails; rank 0 finishes the step it was in and blocks in the next collective
    lines = [_sampler(40, 100, "[rank0]: "), f"[rank1]: {FP8_LORA.format(7)}", _sampler(41, 100, "[rank0]: ")]
    assert fault(lines) == "fp8_op_unsupported"
    # a traceback's exception line, and a NaN loss, are never outlived by a bar other than the trainer's
    exc = [*tb(("/sd/train_network.py", "train")), "RuntimeError: CUDA error: an illegal memory access"]
    assert fault([_sampler(3), *exc, _sampler(4), _sampler(5), _sampler(20)]) == "cuda_fatal"
    nan = "steps:  10%|█         | 100/1000 [01:40<15:00,  1.00s/it, avr_loss=nan]"
    assert fault([_sampler(3), nan, _sampler(4), _sampler(5), _sampler(20)]) == "nan_loss"


def _bytes(lines: list[str]) -> io.BytesIO:
    return io.BytesIO(("\n".join(lines) + "\n").encode())
