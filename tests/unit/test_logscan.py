"""Reading saved logs for diagnose: terminal view of redraws, line numbers, verdicts, command lines."""

from __future__ import annotations

import functools
import io
import random
from pathlib import Path

import pytest

from trainsup.faults import logscan, scanner
from trainsup.faults.linetext import strip_ansi
from trainsup.faults.logscan import command_from_line, terminal_lines
from trainsup.trainers.registry import known_output

# A log of any trainer is read as ``diagnose`` reads it: with every adapter's output format (its
# progress lines drop evidence training outlived; its success line).
KNOWN = known_output()
scan_log = functools.partial(logscan.scan_log, progress=KNOWN)
scan_file = functools.partial(logscan.scan_file, progress=KNOWN)
classify_text = functools.partial(scanner.classify_text, progress=KNOWN)


LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
FIXTURES = sorted(LOGS.glob("*.log"))
BAR = "steps:  {pct:2d}%|██        | {n}/20 [00:04<00:36,  1.52s/it, avr_loss={loss}]"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 72.00 MiB."
SIGKILL_NOISE = "subprocess.CalledProcessError: Command '['python', 'train.py']' died with <Signals.SIGKILL: 9>."


def lines_of(data: bytes, **kw: int) -> list[tuple[int, bytes]]:
    return list(terminal_lines(io.BytesIO(data), **kw))


def bars(n: int, loss: str = "0.1") -> str:
    return "".join("\r" + BAR.format(pct=i * 5, n=i, loss=loss) for i in range(1, n + 1))


def test_a_line_of_redraws_reads_as_its_final_redraw() -> None:
    assert lines_of(b"a\rb\rc\n") == [(1, b"c")]
    assert lines_of(b"\rx\r\n") == [(1, b"x")]  # a trailing \r (CRLF) overwrites nothing
    assert lines_of(b"one\r\ntwo\r\n\r\nthree") == [(1, b"one"), (2, b"two"), (4, b"three")]
    glued = (bars(3) + "Traceback (most recent call last):\n").encode()
    assert lines_of(glued) == [(1, BAR.format(pct=15, n=3, loss="0.1").encode()
                                + b"Traceback (most recent call last):")]


def test_chunk_boundaries_change_nothing() -> None:
    rng = random.Random(3)
    parts = [bars(rng.randrange(1, 30)) + "\n" if rng.random() < 0.3 else f"INFO line {i}\r\n" for i in range(300)]
    data = "".join(parts).encode()
    expected = lines_of(data)
    for size in (1, 7, 64, 4096):
        assert lines_of(data, chunk_size=size) == expected


def test_overlong_lines_are_capped_and_a_huge_redraw_line_stays_bounded() -> None:
    assert lines_of(b"x" * 100 + b"\nok\n", max_line=10) == [(1, b"x" * 10), (2, b"ok")]
    # 20 MB of redraws without a newline: only the last one survives, read in small chunks.
    data = b"start\n" + (bars(1) * 200_000).encode() + b"\rsteps: final\n"
    assert lines_of(data, chunk_size=65536) == [(1, b"start"), (2, b"steps: final")]


def test_a_file_of_carriage_return_terminated_lines_is_read_line_by_line() -> None:
    data = b"first\rTraceback (most recent call last):\r" + OOM.encode() + b"\r"
    assert [n for n, _ in lines_of(data)] == [1, 2, 3]


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_every_fixture_gets_the_live_scanners_verdict_with_its_editor_line(path: Path) -> None:
    raw = path.read_bytes()
    scan = scan_log(io.BytesIO(raw))
    reference = classify_text([raw.decode("utf-8", "replace")])
    assert (scan.verdict.fault if scan.verdict else None) == (reference.fault if reference else None)
    expected = path.name.split("__", 1)[0]
    if expected == "clean":
        assert scan.success and not scan.failed
    if expected == "unknown":  # the run failed, and its exception line says how
        assert scan.failed and scan.verdict is not None and scan.verdict.fault == "unknown"
    if scan.verdict is not None:
        editor_lines = raw.decode("utf-8", "replace").split("\n")
        first_row = strip_ansi(scan.verdict.line.split("\n")[0])
        assert first_row in strip_ansi(editor_lines[scan.verdict.lineno - 1])


def test_the_whole_log_is_read_and_the_trainers_exception_stays_the_verdict() -> None:
    log = "epoch 1/1\nTraceback (most recent call last):\n" + OOM + "\n" + "more output\n" * 1000
    scan = scan_log(io.BytesIO(log.encode()))
    assert scan.verdict is not None and scan.verdict.lineno == 3 and scan.lines == 1003 and scan.failed
    weak = scan_log(io.BytesIO(b"Killed\nlater line\n"))
    assert weak.verdict is not None and weak.verdict.fault == "host_oom_killed"


def test_a_warning_that_training_outlived_is_no_verdict() -> None:
    warning = ("Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'. "
               "Please make sure you already `pip install kernels`")
    trained = (warning + "\n" + bars(3) + "\n" + "model saved.\n").encode()
    scan = scan_log(io.BytesIO(trained))
    assert scan.verdict is None and scan.success and not scan.failed
    # Killed after training started: the launcher's report, not the warning, ended the run.
    killed = (warning + "\n" + bars(3) + "\n" + SIGKILL_NOISE + "\n").encode()
    scan = scan_log(io.BytesIO(killed))
    assert scan.verdict is not None and scan.verdict.fault == "host_oom_killed" and scan.failed
    # Before the first trained step the warning is held, but a later error line explains the end.
    refused = (warning + "\ntrain_network.py: error: unrecognized arguments: --cache_text_encoder_outputs\n").encode()
    scan = scan_log(io.BytesIO(refused))
    assert scan.verdict is not None and scan.verdict.fault == "config_error"


def test_a_nan_loss_in_the_final_redraw_is_found() -> None:
    log = (bars(3) + bars(2, loss="nan") + "\n").encode()
    scan = scan_log(io.BytesIO(log))
    assert scan.verdict is not None and scan.verdict.fault == "nan_loss" and scan.verdict.lineno == 1


@pytest.mark.parametrize(("log", "failed", "success"), [
    ("Traceback (most recent call last):\nValueError: odd\n", True, False),
    ("Traceback (most recent call last):\nModuleNotFoundError: No module named 'triton'\n" + bars(3)
     + "\nmodel saved.\n", False, True),
    ("subprocess.CalledProcessError: Command '['python', 'x.py']' returned non-zero exit status 3.\n", True, False),
    ("epoch 1/1\n" + bars(2) + "\n", False, False),
])
def test_failure_and_success_signs(log: str, failed: bool, success: bool) -> None:
    scan = scan_log(io.BytesIO(log.encode()))
    assert (scan.failed, scan.success) == (failed, success)


@pytest.mark.parametrize(("line", "expected"), [
    ("Running command: accelerate launch --num_cpu_threads_per_process 1 train_network.py --cache_latents",
     (0, ["accelerate", "launch", "--num_cpu_threads_per_process", "1", "train_network.py", "--cache_latents"])),
    ('[12:00:01] [STDOUT] Executing command: "/venv/bin/accelerate" launch "sd/flux_train_network.py" --fp8_base',
     (0, ["/venv/bin/accelerate", "launch", "sd/flux_train_network.py", "--fp8_base"])),
    ("$ python3 sdxl_train_network.py --output_dir o", (0, ["python3", "sdxl_train_network.py", "--output_dir", "o"])),
    (("subprocess.CalledProcessError: Command '['/venv/bin/python', 'train_network.py', '--seed', '1']' returned "
     "non-zero exit status 1."), (1, ["/venv/bin/python", "train_network.py", "--seed", "1"])),
    ("python -m pip install safetensors", None),
    ("/venv/lib/python3.10/site-packages/torch/utils/checkpoint.py:91: UserWarning: x", None),
    ("Running command: 'unbalanced", None),
])
def test_command_lines_in_logs(line: str, expected: tuple[int, list[str]] | None) -> None:
    assert command_from_line(line) == expected


def test_an_explicit_command_line_beats_the_launchers_list() -> None:
    log = ("Running command: accelerate launch train_network.py --cache_latents\n"
           "RuntimeError: Expected all tensors to be on the same device\n"
           "subprocess.CalledProcessError: Command '['python', 'train_network.py']' returned non-zero exit status 1.\n")
    scan = scan_log(io.BytesIO(log.encode()))
    assert scan.command == ["accelerate", "launch", "train_network.py", "--cache_latents"]


def test_a_second_process_reading_a_big_file_changes_nothing(tmp_path: Path) -> None:
    # Many small chunks, a traceback that spans chunk boundaries, evidence near the end.
    rng = random.Random(7)
    parts = ["Running command: accelerate launch flux_train_network.py --cache_latents\n"]
    for i in range(3000):
        parts.append(bars(rng.randrange(1, 6)) + "\n" if i % 3 else f"2024-08-01 12:00:00 INFO     record {i}\n")
    parts += ["Traceback (most recent call last):\n", '  File "train_network.py", line 1, in train\n',
              "RuntimeError: Expected all tensors to be on the same device, but found at least two devices\n"]
    log = tmp_path / "big.log"
    log.write_text("".join(parts) + "tail\n" * 50, encoding="utf-8")
    serial = scan_file(str(log), chunk_size=4096, parallel=False)
    parallel = scan_file(str(log), chunk_size=4096, parallel=True)
    assert parallel == serial
    assert serial.verdict is not None and serial.verdict.fault == "device_mismatch" and serial.failed
    clean = tmp_path / "clean.log"
    clean.write_text("".join(parts[:-3]) + "model saved.\n", encoding="utf-8")
    assert scan_file(str(clean), chunk_size=4096, parallel=True) == scan_file(str(clean), chunk_size=4096,
                                                                              parallel=False)


def test_unreadable_files_raise_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        scan_file(str(tmp_path / "missing.log"))
    with pytest.raises(IsADirectoryError):
        scan_file(str(tmp_path), parallel=True)
