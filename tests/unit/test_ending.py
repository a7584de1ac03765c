"""Issue 35: the failure a log ends with, whatever its shape, and never a crash read as healthy.

The reader (``faults.ending``, ``faults.verdict``, ``faults.tracebacks``) against the forms the held-out
sets missed: a fault line without its traceback header, a bare kernel assertion, a fatal error with
one more progress bar after it, a shell's ``Killed`` or a launcher's -9, a log that ends waiting at a
barrier, NaN in any shape that names a loss (and the crash it causes), trainer and library wording,
a warning before the exception the log ends with, and an unknown failure that must show its line.
"""

from __future__ import annotations

import functools
import io

import pytest

from trainsup.adapters.kohya.rules import FAMILY_RULES as KOHYA_RULES
from trainsup.commands.diagnose import build_plan, diagnose_scan, plan_remedy
from trainsup.faults import logscan, scanner
from trainsup.faults.dumps import DUMP_RULES
from trainsup.faults.rules import BUILTIN_RULES
from trainsup.faults.scanner import Evidence, ExitInfo, FaultScanner, classify_exit
from trainsup.faults.verdict import Said
from trainsup.trainers.registry import known_output

# A log of any trainer is read as ``diagnose`` reads it: with every adapter's output format (its
# progress lines drop evidence training outlived; its success line).
KNOWN = known_output()
scan_log = functools.partial(logscan.scan_log, progress=KNOWN)
classify_text = functools.partial(scanner.classify_text, progress=KNOWN)


DIAGNOSE = DUMP_RULES + BUILTIN_RULES
BNB = ("Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'. Please make sure "
       "you already `pip install kernels` and the kernels >= 0.11.1")


def verdict(lines: list[str], diagnose: bool = False) -> Evidence | None:
    return classify_text(lines, DIAGNOSE if diagnose else BUILTIN_RULES)


def fault(lines: list[str], diagnose: bool = False) -> str | None:
    found = verdict(lines, diagnose)
    return found.fault if found is not None else None


def tb(*frames: str) -> list[str]:
    out = ["Traceback (most recent call last):"]
    for frame in frames:
        out += [f'  File "/w/{frame}.py", line 10, in {frame}', "    step()"]
    return out


def bar(step: int, total: int = 100, loss: str = "0.1") -> str:
    return f"steps:  {step}%|█         | {step}/{total} [00:{step:02d}<01:00,  1.00it/s, avr_loss={loss}]"


# --- an unknown failure shows its line ------------------------------------------------------------

def test_an_exception_no_rule_names_is_unknown_with_its_line() -> None:
    line = "RuntimeError: something odd happened in my custom trainer"
    for lines in ([line], [*tb("train"), line], ["[rank1]: " + line], [bar(5), *tb("train"), line]):
        found = verdict(lines)
        assert found is not None and (found.fault, found.line.removeprefix("[rank1]: ")) == ("unknown", line)
        assert classify_exit(ExitInfo(1, None, None, None, False), found) == "unknown"
    # a SIGKILL of the process outranks an exception no rule names (the kill ended it)
    assert classify_exit(ExitInfo(None, 9, None, None, False), verdict([line])) == "host_oom_killed"


def test_a_signal_death_is_unknown_with_its_line_unless_evidence_just_before_explains_it() -> None:
    seg = [bar(3), "{'loss': 2.04, 'epoch': 4.4}", "Segmentation fault (core dumped)"]
    found = verdict(seg)
    assert found is not None and (found.fault, found.line) == ("unknown", "Segmentation fault (core dumped)")
    watchdog = [("[E ProcessGroupNCCL.cpp:458] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL("
                "SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800211 milliseconds before timing out."),
                "terminate called after throwing an instance of 'std::runtime_error'", "Aborted (core dumped)"]
    assert fault(watchdog) == "nccl_timeout"


def test_a_launchers_report_and_a_harmless_lookalike_are_no_failure_of_their_own() -> None:
    ended = ("subprocess.CalledProcessError: Command '['python', 'train.py']' returned non-zero exit status 1.")
    assert fault([ended]) is None  # (diagnose still calls the run failed, by the launcher's report)
    triton = [*tb("xformers_init"), "ModuleNotFoundError: No module named 'triton'", bar(3), bar(9)]
    assert fault(triton) is None


def test_training_that_went_on_outlives_an_exception_no_rule_names() -> None:
    caught = [*tb("probe"), "ValueError: optional feature unavailable"]
    assert fault([*caught, "{'loss': 1.91, 'epoch': 0.1}", "{'loss': 1.72, 'epoch': 0.2}"]) is None
    assert fault([*caught, "Step 1 | loss:2.19 lr:2e-05", "Step 2 | loss:1.90 lr:2e-05"]) is None
    assert fault([*caught, bar(4), bar(5)]) is None
    assert fault([*caught, "{'loss': 1.91, 'epoch': 0.1}"]) == "unknown"  # one metric line may be another rank's


def test_chained_exceptions_keep_the_evidence_of_the_first() -> None:
    killed = "RuntimeError: DataLoader worker (pid 2211) is killed by signal: Killed."
    lines = [*tb("loop"), killed, "", "The above exception was the direct cause of the following exception:", "",
             *tb("train"), "RuntimeError: DataLoader worker (pid(s) 2211) exited unexpectedly"]
    assert fault(lines) == "host_oom_killed"


# --- a warning never outranks the exception the log ends with --------------------------------------

def test_a_warning_on_line_one_does_not_outrank_the_size_mismatch_the_run_died_of() -> None:
    lines = [BNB, "INFO     loading network weights from out/tiny-state", *tb("train_network", "load_state"),
             "RuntimeError: Error(s) in loading state_dict for LoRANetwork:",
             ("\tsize mismatch for lora_unet_down_blocks_0_attn.lora_down.weight: copying a param with shape "
             "torch.Size([8, 320]) from checkpoint, the shape in current model is torch.Size([4, 320]).")]
    found = verdict(lines)
    assert found is not None and found.fault == "config_error" and "size mismatch" in found.line
    # no rule for the exception: still the exception, as unknown, never the warning
    other = [BNB, "INFO     loading", *tb("train"), "RuntimeError: something odd happened in my custom trainer"]
    found = verdict(other)
    assert found is not None and found.fault == "unknown" and found.line.startswith("RuntimeError:")
    # a line the traceback itself holds does explain it
    logged = [*tb("save"), "No space left on device while writing out/x.safetensors", "RuntimeError: save failed"]
    assert fault(logged) == "disk_full"


# --- a crash read as healthy -----------------------------------------------------------------------

@pytest.mark.parametrize("lines", [
    # a fault line without its Traceback header: the paste starts below it
    ['  File "/w/train.py", line 9, in main', "    loss.backward()",
     "RuntimeError: CUDA error: an illegal memory access was encountered"],
    # a bare kernel assertion, glued to a bar, no RuntimeError line
    [(" 0%|          | 0/512 [00:00<?, ?it/s]/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): "
     "block: [3,0,0], thread: [7,0,0] Assertion `index >= -sizes[i] && index < sizes[i] && \"index out of bounds\"` "
     "failed.")],
    # ROCm: a device-side assertion that says neither CUDA nor RuntimeError
    [("/pytorch/aten/src/ATen/native/hip/Indexing.hip:1292: indexSelectLargeIndex: Device-side assertion "
     "`srcIndex < srcSelectDimSize' failed.")],
    ["torch.AcceleratorError: HIP error: an illegal memory access was encountered"],
    # a fatal error with one more bar line after it (tqdm's closing redraw, one step on)
    [bar(41), *tb("train"), "RuntimeError: CUDA error: unspecified launch failure", bar(42)],
])
def test_a_fatal_gpu_error_in_any_shape_is_cuda_fatal(lines: list[str]) -> None:
    assert fault(lines) == "cuda_fatal"


def test_two_more_steps_do_outlive_a_fatal_error() -> None:
    assert fault([bar(41), *tb("sample"), "RuntimeError: CUDA error: unspecified launch failure", bar(42),
                  bar(43)]) is None


@pytest.mark.parametrize("line", [
    "Killed", "  5%|▌         | 52/1000 [03:11<58:01,  3.67s/it]Killed",
    "./train.sh: line 14: 40211 Killed   python x.py",
    "zsh: killed     python train.py",
    ("[2023-04-20 09:58:33,611] [ERROR] [launch.py:434:sigkill_handler] ['python', 'main.py'] "
     "exits with return code = -9"),
    "Process finished with exit code 137 (interrupted by signal 9: SIGKILL)",
    "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGKILL",
])
def test_a_sigkill_reported_by_a_shell_or_a_launcher_is_host_oom_killed(line: str) -> None:
    assert fault(["{'loss': 1.2, 'epoch': 1.0}", line]) == "host_oom_killed"


def test_a_log_that_ends_waiting_at_a_barrier_is_a_hang_only_where_it_ends() -> None:
    warning = ("[rank{}]:[W207 22:21:42.712978449 ProcessGroupNCCL.cpp:4115] [PG ID 0 PG GUID 0 Rank {}]  using GPU {} "
               "to perform barrier as devices used by this process are currently unknown. This can potentially "
               "cause a hang if this rank to GPU mapping is incorrect.")
    ranks = [warning.format(n, n, n) for n in range(3)]
    assert fault(ranks, diagnose=True) == "hang"
    assert fault([ranks[0], "INFO     Loaded AE", ranks[1], ""], diagnose=True) == "hang"
    assert fault([*ranks, "INFO     caching latents..."], diagnose=True) is None  # it went on
    assert fault([*ranks, bar(1)], diagnose=True) is None
    assert fault(ranks) is None  # the live supervisor has its hang clock: not from a warning


def test_ctrl_c_over_waiting_frames_without_a_keyboardinterrupt_line_is_a_hang() -> None:
    lines = ["Epoch: [3][413/1705]	Loss 51.0291 (52.3273)", "^CProcess Process-4:", "Process Process-2:",
             "Traceback (most recent call last):", "Traceback (most recent call last):",
             '  File "/py/multiprocessing/process.py", line 267, in _bootstrap', "    self.run()",
             '  File "/py/site-packages/torch/utils/data/dataloader.py", line 52, in _worker_loop',
             "    r = index_queue.get()", '  File "/py/multiprocessing/queues.py", line 376, in get', "    racquire()"]
    assert fault(lines, diagnose=True) == "hang"
    computing = ["^CTraceback (most recent call last):", '  File "/w/train.py", line 9, in main',
                 '  File "/py/torch/nn/modules/module.py", line 1501, in _call_impl']
    assert fault(computing, diagnose=True) != "hang"


# --- NaN in any shape that names a loss -------------------------------------------------------------

@pytest.mark.parametrize("line", [
    "{'loss': nan, 'grad_norm': nan, 'learning_rate': 0.00028, 'epoch': 0.55}",
    "2023-03-22 09:32:52 iter 3010: loss nan, time 1019.95ms, mfu 14.12%",
    "Time: 2024-10-31 18:32:24; Epoch: 69; pid_loss: nan;  triplet_loss: nan;",
    "Epoch: 12 mask_loss:  nan size_loss:  nan offset_loss:  nan",
    "run_x:   0%|          | 2/3000 [00:06<2:48:10,  3.37s/it, lr: 1.0e-04 loss: nan]",
    "loss: tensor(nan, device='cuda:0', grad_fn=<NllLossBackward0>)",
    "│      train_loss       │          nan          │",
    "wandb:          train/loss nan",
    "DLL 2020-06-02 11:12:07 - Training Epoch: 0 Training Iteration: 1712  average_loss : nan  step_loss : nan",
    "ERROR:tensorflow:Model diverged with loss = NaN.",
    "2018-12-19 22:40:34 INFO: iter: 1980  loss: nan (nan)  loss_classifier: nan (nan)",
])
def test_nan_in_any_shape_that_names_a_loss_is_nan_loss(line: str) -> None:
    found = verdict(["{'loss': 2.1, 'epoch': 0.1}", line])
    assert found is not None and found.fault == "nan_loss" and found.live


@pytest.mark.parametrize("line", [
    "{'loss': 1.7713, 'grad_norm': nan, 'learning_rate': 0.00029, 'epoch': 0.16}",
    "Unsloth: Untrained tokens found, causing NaNs. Restart then add embed_tokens",
    "INFO loss_scale: 65536, skipped steps with nan gradients: 3",
    "model: nanoGPT, loss_type: l2",
])
def test_nan_that_is_not_a_loss_is_no_nan_loss(line: str) -> None:
    assert fault(["{'loss': 2.1, 'epoch': 0.1}", line]) != "nan_loss"


def test_a_notebook_training_table_with_a_nan_row_is_nan_loss() -> None:
    table = [" [14/100 01:53 < 12:24, 0.12 it/s, Epoch 0.06/1]", "Step\tTraining Loss", "1\t2.418700", "2\t2.397100"]
    assert fault(table) is None
    assert fault([*table, "3\tnan", "4\tnan"]) == "nan_loss"
    assert fault(["Step\tTraining Loss\tValidation Loss", "10\t1.203000\tnan"]) == "nan_loss"
    assert fault(["Learning rate schedule:", "3\tnan"]) is None  # no loss table in sight


def test_the_nan_stands_over_the_crash_it_caused() -> None:
    lines = [bar(10), bar(11, loss="nan"), *tb("sample"), "RuntimeError: CUDA error: device-side assert triggered"]
    assert fault(lines) == "nan_loss"
    lines = ["iter 30: loss nan, time 1019.95ms", *tb("generate"),
             "RuntimeError: probability tensor contains either `inf`, `nan` or element < 0"]
    assert fault(lines) == "nan_loss"


def test_an_out_of_memory_first_cause_stands_over_the_crash_of_another_rank() -> None:
    lines = ["[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
             "[rank0]: Traceback (most recent call last):", '[rank0]:   File "/w/train.py", line 9, in step',
             ("[rank0]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process "
             "exited or there was a network error")]
    assert fault(lines) == "cuda_oom"


# --- trainer and library wording ---------------------------------------------------------------------

@pytest.mark.parametrize(("line", "expected"), [
    ("Error running job: CUDA out of memory. Tried to allocate 72.00 MiB.", "cuda_oom"),
    ("RuntimeError: No executable batch size found, reached zero.", "cuda_oom"),
    ("RuntimeError: HIP error: out of memory", "cuda_oom"),
    ("RuntimeError: unexpected EOF, expected 3786101 more bytes. The file might be corrupted.", "corrupt_checkpoint"),
    ("RuntimeError: unexpected EOF. The file might be corrupted", "corrupt_checkpoint"),
    ("RuntimeError: Invalid magic number; corrupt file?", "corrupt_checkpoint"),
    ("RuntimeError: HIP error: hipErrorNoBinaryForGpu: Unable to find code object for all current devices!",
     "missing_dependency"),
])
def test_trainer_and_library_wording(line: str, expected: str) -> None:
    assert fault([line]) == expected


def test_sd_scripts_own_wording_is_its_adapters_rules() -> None:
    """musubi's and sd-scripts' TOML line is read by kohya's family rules (as ``diagnose`` and a kohya
    run compose them), not by the built-in table, which knows no trainer's wording."""
    line = ("ERROR:musubi_tuner.dataset.config_utils:Error on parsing TOML config file. "
            "Please check the format. / TOML "
            "\\u5f62\\u5f0f\\u306e\\u8a2d\\u5b9a: E:\\lora\\dataset_config.toml")
    found = classify_text([line], KOHYA_RULES + BUILTIN_RULES)
    assert found is not None and found.fault == "config_error"
    assert fault([line]) is None


def test_a_none_while_text_embeddings_are_precomputed_for_captions_is_no_te_cache_miss() -> None:
    frames = tb("train", "compute_embeddings_for_prompts", "encode_prompt")
    found = verdict([*frames, "AttributeError: 'NoneType' object has no attribute 'to'"])
    assert found is not None and found.fault == "unknown"
    scan = scan_log(io.BytesIO("\n".join([*frames, "AttributeError: 'NoneType' object has no attribute 'to'", ""])
                               .encode()))
    assert not any(r.startswith(("remove", "add")) for r in diagnose_scan("c.log", scan).remedy)


# --- the numbers an OOM message carries choose the rung --------------------------------------------------

NEW = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 "
       "GiB of which 40.12 GiB is free. Including non-PyTorch memory, this process has 38.95 GiB memory in use. "
       "{allowed}Of the allocated memory 37.10 GiB is allocated by PyTorch, and {unalloc} is reserved by PyTorch but "
       "unallocated.")
OLD = ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 14.75 GiB total capacity; 13.53 GiB "
       "already allocated; 10.81 MiB free; {reserved} reserved in total by PyTorch)")


@pytest.mark.parametrize(("evidence", "useful"), [
    (NEW.format(allowed="39.00 GiB allowed; ", unalloc="12.00 MiB"), False),  # capped, no fragmentation
    (NEW.format(allowed="39.00 GiB allowed; ", unalloc="3.20 GiB"), True),
    (NEW.format(allowed="", unalloc="12.00 MiB"), True),  # 40 GiB free on the device: not ruled out
    (OLD.format(reserved="13.95 GiB"), True),  # 420 MiB cached but not handed out: fragmentation
    (OLD.format(reserved="13.53 GiB"), False),  # nothing cached unused, 10.81 MiB free: 20 MiB cannot fit
    ("torch.OutOfMemoryError: CUDA out of memory.", True),  # no numbers: nothing ruled out
])
def test_the_allocator_rung_is_skipped_when_the_numbers_rule_fragmentation_out(evidence: str, useful: bool) -> None:
    from trainsup.faults.remedies import ladder

    rung = ladder("cuda_oom")[0]
    assert rung.fits(Said(evidence)) is useful
    assert (rung.unfit_reason(Said(evidence)) is None) is useful
    kohya = build_plan("accelerate launch train_network.py --output_dir o".split())
    first = plan_remedy("cuda_oom", kohya, Said(evidence)).changes
    assert first == (["set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"] if useful
                     else ["add --gradient_checkpointing"])
    # No trainer known: the neutral ladder's next rung, in no trainer's flags.
    neutral = plan_remedy("cuda_oom", None, Said(evidence)).changes
    assert neutral == (["set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"] if useful
                       else ["halve the batch size and double the gradient accumulation steps"])


def test_every_adapters_allocator_rung_reads_the_numbers() -> None:
    from trainsup.adapters.litgpt.remedies import LADDERS as LIT
    from trainsup.adapters.onetrainer.remedies import LADDERS as OT
    from trainsup.faults.remedies import Rung

    capped = Said(NEW.format(allowed="39.00 GiB allowed; ", unalloc="12.00 MiB"))
    rungs: list[Rung] = [r for ladder in (LIT["cuda_oom"], OT["cuda_oom"]) for r in ladder]
    allocator = [r for r in rungs if any(a.kind == "set_env" and "expandable" in (a.value or "") for a in r.actions)]
    assert allocator and all(not r.fits(capped) for r in allocator)
    assert all(r.fits(capped) for r in rungs if r not in allocator and r.when is None)


def test_the_scanner_gives_a_failure_with_no_line_of_its_own_its_last_lines() -> None:
    scanner = FaultScanner(BUILTIN_RULES)
    for n, line in enumerate(["epoch 1/3", "saving checkpoint", "  3%|▎         | 3/100 [00:03<01:37]", "done?"], 1):
        scanner.feed(line, n)
    found = scanner.last_lines_evidence()
    assert found is not None and (found.fault, found.line, found.lineno) == ("unknown",
                                                                            "epoch 1/3\nsaving checkpoint\ndone?", 1)
