"""The fault classifier: rules, streaming scanner, exit classification, user rules.

Every file in tests/fixtures/logs is named ``<expected>__<variant>.log``: ``clean``
expects no verdict, ``unknown`` expects no evidence although the run failed, any
other prefix is the fault id the log must be classified as.
"""

from __future__ import annotations

import re
import timeit
from pathlib import Path

import pytest

from trainsup.faults.linetext import clean_line
from trainsup.faults.rules import BUILTIN_RULES, FAULT_IDS, FaultRule
from trainsup.faults.scanner import (
    Evidence,
    ExitInfo,
    FaultScanner,
    KeyIndex,
    classify_exit,
    classify_text,
    parse_child_status,
)
from trainsup.faults.userrules import compose_rules, load_user_rules
from trainsup.trainers.registry import family_rules

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
FIXTURES = sorted(LOGS.glob("*.log"))

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 72.00 MiB. GPU 0 has a total capacity of 23.54 GiB"
SIGKILL_NOISE = "subprocess.CalledProcessError: Command '['python', 'train.py']' died with <Signals.SIGKILL: 9>."


def _read(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as f:  # keep the \r of progress bars
        return f.read()


def _expected(path: Path) -> str | None:
    """The verdict's fault: an ``unknown`` failure is evidence too (its exception line), a clean log has none."""
    prefix = path.name.split("__", 1)[0]
    return None if prefix == "clean" else prefix


def _scan(lines: list[str], rules: tuple[FaultRule, ...] = BUILTIN_RULES) -> tuple[FaultScanner, list[Evidence]]:
    scanner = FaultScanner(rules)
    new = [ev for n, line in enumerate(lines, 1) if (ev := scanner.feed(line, n)) is not None]
    return scanner, new


# --- the table -------------------------------------------------------------------------

def test_fault_ids_and_rule_table_cover_each_other() -> None:
    assert len(set(FAULT_IDS)) == len(FAULT_IDS) == 20
    assert {"hang", "unknown"} <= set(FAULT_IDS)
    assert {r.id for r in BUILTIN_RULES} == set(FAULT_IDS) - {"hang", "unknown"}
    by_id = {r.id: r for r in BUILTIN_RULES}
    assert {i for i, r in by_id.items() if not r.restartable} == {"config_error", "missing_dependency", "disk_full"}
    assert {i for i, r in by_id.items() if r.live} == {"nan_loss"}
    assert {i for i, r in by_id.items() if r.strength == "weak"} == {"host_oom_killed"}
    assert all(r.explanation.endswith(".") for r in BUILTIN_RULES)


def test_every_builtin_pattern_has_prefilter_keys() -> None:
    # A pattern without keys would be tried on every line and make feed() slow.
    index = KeyIndex([re.compile(p) for r in BUILTIN_RULES for p in r.patterns])
    assert not index.unkeyed


def test_every_fault_has_a_fixture() -> None:
    covered = {p.name.split("__", 1)[0] for p in FIXTURES}
    assert set(FAULT_IDS) - {"hang"} <= covered
    assert "clean" in covered


# --- fixtures -------------------------------------------------------------------------

@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_fixture_is_classified_as_its_name_says(path: Path) -> None:
    # With every adapter's own wording before the built-in table, as ``diagnose`` reads a log.
    verdict = classify_text([_read(path)], family_rules() + BUILTIN_RULES)
    assert (verdict.fault if verdict else None) == _expected(path), verdict
    if path.name.startswith("unknown__"):
        assert classify_exit(ExitInfo(1, None, 1, None, False), verdict) == "unknown"
    if verdict is not None:
        # The evidence is a real line of the log (two or more when a wrapped message matched).
        assert all(row in _read(path).replace("\r", "\n").split("\n") for row in verdict.line.split("\n"))


def test_prefilter_never_hides_a_match() -> None:
    # For every line of every fixture: a pattern that matches the cleaned line is
    # always among the candidates the prefilter proposes.
    patterns = [re.compile(p) for r in BUILTIN_RULES for p in r.patterns]
    index = KeyIndex(patterns)
    checked = 0
    for path in FIXTURES:
        for raw in re.split(r"\r\n|\r|\n", _read(path)):
            text = clean_line(raw)
            matching = {n for n, p in enumerate(patterns) if p.search(text)}
            if matching:
                checked += 1
                assert index.hit(text), text
                assert matching <= set(index.candidates(text)), text
    assert checked > 50


# --- the verdict ----------------------------------------------------------------------

def test_first_root_evidence_wins_over_launcher_noise() -> None:
    scanner, new = _scan(["Traceback (most recent call last):", OOM, "Killed", SIGKILL_NOISE])
    assert [e.fault for e in new] == ["cuda_oom", "host_oom_killed"]
    assert scanner.verdict is not None and scanner.verdict.fault == "cuda_oom"
    assert scanner.verdict.line == OOM and scanner.verdict.lineno == 2


def test_root_evidence_after_weak_evidence_still_wins() -> None:
    scanner, _ = _scan(["Killed", OOM])
    assert scanner.verdict is not None and scanner.verdict.fault == "cuda_oom"


def test_weak_evidence_alone_is_the_verdict() -> None:
    scanner, _ = _scan(["epoch 1/1", SIGKILL_NOISE])
    assert scanner.verdict is not None
    assert (scanner.verdict.fault, scanner.verdict.strength) == ("host_oom_killed", "weak")
    assert scanner.child_status == (None, 9)


def test_feed_reports_each_fault_once_so_live_faults_act_at_once() -> None:
    bar = "steps:  35%|███       | 7/20 [00:14<00:26,  1.52s/it, avr_loss={}]"
    scanner, new = _scan([bar.format("0.12"), bar.format("nan"), bar.format("nan"), bar.format("nan")])
    assert [(e.fault, e.lineno) for e in new] == [("nan_loss", 2)]
    assert scanner.evidence == tuple(new)


def test_a_gui_saying_finished_after_a_failure_changes_nothing() -> None:
    scanner, _ = _scan([OOM, "Training finished", "finished", "model saved."])
    assert scanner.verdict is not None and scanner.verdict.fault == "cuda_oom"


def test_non_matching_lines_give_no_evidence_and_cost_little() -> None:
    scanner = FaultScanner()
    line = "2024-08-01 12:00:00 INFO     loading model for process 0/1 from /models/flux1.safetensors   train_util.py:4"
    bar = "steps:  10%|█         | 100/1000 [01:23<12:27,  1.20it/s, avr_loss=0.123]"
    assert scanner.feed(line, 1) is None and scanner.feed(bar, 2) is None
    index = KeyIndex([re.compile(p) for r in BUILTIN_RULES for p in r.patterns])
    assert not index.hit(clean_line(line)) and not index.hit(clean_line(bar))  # rejected by the prefilter
    counter = iter(range(3, 10**9))
    per_line = min(timeit.repeat(lambda: scanner.feed(line, next(counter)), number=2000, repeat=5)) / 2000
    assert per_line < 50e-6  # ~2-5 us on a laptop; generous so a loaded CI box passes
    assert scanner.verdict is None


def test_pathological_long_lines_stay_cheap_and_a_message_at_their_start_still_counts() -> None:
    scanner = FaultScanner()
    bad = ["Tried to find " * 4600, "Assertion `" * 5900, "Error " * 10900, " " * 65000, "/dev/shm " * 7000]
    started = timeit.default_timer()
    for n, line in enumerate(bad, 1):
        scanner.feed(line, n)
    assert timeit.default_timer() - started < 2.0  # quadratic backtracking would take minutes
    assert scanner.verdict is None
    assert classify_text([OOM + " " + "x" * 65000]) is not None


# --- noisy shapes ---------------------------------------------------------------------

def test_message_wrapped_over_two_rows_with_or_without_a_space() -> None:
    rows = ["2024-08-01 12:00:00 ERROR    OSError: [Errno 28] No space left on      train_util.py:12",
            "                             device: '/out/x'"]
    _, new = _scan(rows)
    assert [e.fault for e in new] == ["disk_full"]  # Errno 28 alone already counts
    _, new = _scan(["ERROR    RuntimeError: Expected all tensors to be on the sa",
                    "                             me device, but found at least two devices"])
    assert [e.fault for e in new] == ["device_mismatch"]
    _, new = _scan(["ERROR    NotImplementedError: Cannot copy out of", "                             meta tensor"])
    assert [(e.fault, e.lineno) for e in new] == [("meta_tensor", 1)]
    assert new[0].line.count("\n") == 1


def test_a_word_rich_folded_mid_word_is_rejoined() -> None:
    # rich breaks only words longer than its column: the row before ends in a long run.
    rows = ["ERROR    safetensors_rust.SafetensorError:HeaderTo", "                             oLarge"]
    _, new = _scan(rows)
    assert [(e.fault, e.lineno, e.line) for e in new] == [("corrupt_checkpoint", 1, "\n".join(rows))]


def test_a_message_over_several_rows_is_rejoined() -> None:
    rows = ["ERROR    Error loading file:", "/data/train/10_character/very_long_di",
            "rectory_name_for_images/image_000123_", "1024x1024_flux.npz"]
    _, new = _scan(rows)
    assert [(e.fault, e.lineno) for e in new] == [("corrupt_checkpoint", 1)]


def test_a_warning_stays_a_warning_when_its_message_is_wrapped() -> None:
    _, new = _scan(["/venv/x.py:1: UserWarning: could not write the cache: No space left on", "device"])
    assert new == []


def test_a_warning_row_does_not_mask_the_wrapped_error_after_it() -> None:
    rows = ["/venv/x.py:1: UserWarning: something harmless", "ERROR    RuntimeError: Expected all tensors to be on",
            "the same device, but got mat2"]
    _, new = _scan(rows)
    assert [(e.fault, e.lineno) for e in new] == [("device_mismatch", 2)]


def test_rows_of_different_rich_records_are_not_joined() -> None:
    # "Tried to find X but folder does not exist" spread over two records is not one message.
    rows = ["2024-08-01 12:00:00 INFO     Tried to find the best bucket for       train_util.py:1",
            "                    INFO     the images but folder does not exist     train_util.py:2"]
    assert _scan(rows)[1] == []
    rows[1] = "                             the images but folder does not exist"
    assert [e.fault for e in _scan(rows)[1]] == ["config_error"]


def test_progress_bar_glued_to_the_error_line() -> None:
    bar = "steps:  20%|██        | 4/20 [00:08<00:32,  1.52s/it, avr_loss=0.142]"
    _, new = _scan([bar + "Traceback (most recent call last):", '  File "train.py", line 3, in train', OOM])
    assert [e.fault for e in new] == ["cuda_oom"]
    _, new = _scan([bar[:40] + "RuntimeError: CUDA error: an illegal memory access was encountered"])
    assert [e.fault for e in new] == ["cuda_fatal"]


def test_interleaved_ranks_keep_their_own_traceback_frames() -> None:
    lines = ["[rank0]: Traceback (most recent call last):", "[rank1]: Traceback (most recent call last):",
             '[rank0]:   File "train_util.py", line 1387, in __getitem__',
             '[rank1]:   File "flux_train_utils.py", line 187, in sample_image_inference',
             "[rank0]: AttributeError: 'NoneType' object has no attribute 'to'",
             "[rank1]: AttributeError: 'NoneType' object has no attribute 'to'"]
    _, new = _scan(lines)
    assert [(e.fault, e.lineno) for e in new] == [("te_cache_none", 6)]


@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        ([], "te_cache_none"),
        ([("flux_train_network.py", "sample_images"), ("flux_train_utils.py", "sample_image_inference")],
         "te_cache_none"),
        # Not a sample prompt's cache miss: the run still failed, with that line (unknown).
        ([("train_network.py", "train"), ("train_util.py", "__getitem__")], "unknown"),
        ([("train_network.py", "train"), ("flux_utils.py", "load_clip_l")], "unknown"),
        ([("train_network.py", "train"), ("strategy_flux.py", "encode_tokens")], "unknown"),
        ([("sample_util.py", "sample_images"), ("dataset.py", "prepare")], "unknown"),
        # Text embeddings pre-computed for the captions (a caption is None): never te_cache_none.
        ([("train.py", "main"), ("text_embed_cache.py", "compute_embeddings_for_prompts"),
          ("text_embed_cache.py", "encode_prompt")], "unknown"),
        ([("train_network.py", "train"), ("train_util.py", "cache_text_encoder_outputs"),
          ("strategy_sdxl.py", "get_hidden_states_sdxl")], "unknown"),
    ],
)
def test_te_cache_none_is_judged_by_the_failing_tracebacks_frames(frames: list[tuple[str, str]],
                                                                 expected: str | None) -> None:
    lines = ["Traceback (most recent call last):"] if frames else []
    for path, func in frames:
        lines += [f'  File "/sd/{path}", line 10, in {func}', "    x = y.to(device)"]
    lines.append("AttributeError: 'NoneType' object has no attribute 'to'")
    verdict = classify_text(lines)
    assert (verdict.fault if verdict else None) == expected


def test_windows_dataloader_spawn_failure_is_not_a_corrupt_checkpoint() -> None:
    spawn = ["Traceback (most recent call last):", '  File "<string>", line 1, in <module>',
             '  File "C:\\Python310\\lib\\multiprocessing\\spawn.py", line 126, in _main',
             "    self = reduction.pickle.load(from_parent)", "EOFError: Ran out of input"]
    verdict = classify_text(spawn)
    assert verdict is not None and verdict.fault == "unknown" and verdict.line == "EOFError: Ran out of input"
    state = ["Traceback (most recent call last):", '  File "/venv/accelerate/checkpointing.py", line 260, in load',
             "    states = pickle.load(f)", "EOFError: Ran out of input"]
    verdict = classify_text(state)
    assert verdict is not None and verdict.fault == "corrupt_checkpoint"


def test_nonetype_wording_other_than_to_or_ndim_is_not_te_cache_none() -> None:
    for line in ("AttributeError: 'NoneType' object has no attribute 'shape'",
                 "AttributeError: 'NoneType' object has no attribute 'to' (dataset image 3)",
                 "AttributeError: 'NoneType' object has no attribute 'to' (caption of img_0007.png)"):
        verdict = classify_text([line])
        assert verdict is not None and (verdict.fault, verdict.line) == ("unknown", line)


def test_code_lines_under_frames_are_not_taken_as_evidence_lines() -> None:
    verdict = classify_text(["Traceback (most recent call last):",
                             '  File "/sd/strategy_base.py", line 530, in cache',
                             '    raise RuntimeError(f"NaN detected in latents: {path}")',
                             "RuntimeError: NaN detected in latents: /data/img_0014.png"])
    assert verdict is not None and verdict.line.startswith("RuntimeError:") and verdict.lineno == 4


@pytest.mark.parametrize(
    "line",
    [
        "/venv/torch/cuda/__init__.py:619: UserWarning: CUDA error: out of memory while probing NVML",
        "/venv/x.py:1: FutureWarning: `torch.cuda.OutOfMemoryError` will move to torch.OutOfMemoryError",
        ("2024-08-01 12:00:00.1: W tensorflow/dso_loader.cc:64] Could not load dynamic library 'libcudart.so.11.0'; "
         "dlerror: libcudart.so.11.0: cannot open shared object file: No such file or directory"),
        "Error caught was: No module named 'triton'",
        "CUDA SETUP: Problem: The main issue seems to be that the main CUDA runtime library was not detected.",
    ],
)
def test_warnings_and_known_library_noise_never_count(line: str) -> None:
    assert classify_text([line]) is None


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("OSError: [Errno 28] No space left on device: '/dev/shm/torch_1'", "shm_exhausted"),
        ("RuntimeError: unable to write to file </torch_51_28_0>: No space left on device (28)", "shm_exhausted"),
        ("OSError: [Errno 28] No space left on device: '/out/x.bin'", "disk_full"),
        ("PermissionError: [Errno 13] Permission denied: '/out/x.bin'", "config_error"),
        ("ValueError: Tried to find /out/x-state but folder does not exist", "config_error"),
        ("FileNotFoundError: [Errno 2] No such file or directory: '/out/x-step00000010-state/optimizer.bin'",
         "corrupt_checkpoint"),
        ("RuntimeError: CUDA error: out of memory", "cuda_oom"),
        ("RuntimeError: CUDA error: no kernel image is available for execution on the device", "missing_dependency"),
        ("RuntimeError: CUDA error: invalid device ordinal", "config_error"),
        ("RuntimeError: CUDA error: misaligned address", "cuda_fatal"),
        (("RuntimeError: Expected all tensors to be on the same device, "
          "but found at least two devices, cuda:0 and meta!"),
         "meta_tensor"),
        (("[rank1]:[E801] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1) ran for 600032 "
          "milliseconds before timing out."), "nccl_timeout"),
        ("KeyError: torch.float8_e5m2", "fp8_serializer"),
        ("TypeError: dtype torch.float8_e4m3fn is not recognized", "fp8_serializer"),
        ("tomllib.TOMLDecodeError: Invalid value (at line 3, column 9)", "config_error"),
        ("AssertionError: shuffle_caption cannot be used with cache_text_encoder_outputs", "flag_conflict"),
        ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "cuda_oom"),
        ("exitcode  : -9 (pid: 5002)", "host_oom_killed"),
        ("subprocess.CalledProcessError: Command 'x' returned non-zero exit status 137.", "host_oom_killed"),
    ],
)
def test_specific_wording_beats_the_generic_wording_it_contains(line: str, expected: str) -> None:
    verdict = classify_text([line])
    assert verdict is not None and verdict.fault == expected


def test_classify_text_splits_carriage_returns() -> None:
    text = ("steps:   5%|          | 1/20 [00:02<00:38, avr_loss=0.1]"
            "\rsteps:  10%|█         | 2/20 [00:04<00:36, avr_loss=nan]")
    verdict = classify_text([text])
    assert verdict is not None and (verdict.fault, verdict.lineno) == ("nan_loss", 2)


# --- exit status ----------------------------------------------------------------------

def _ev(fault: str, strength: str = "root", anchored: bool = True, consequence: bool = False) -> Evidence:
    return Evidence(fault, "x", 1, strength, anchored=anchored, live=fault == "nan_loss", consequence=consequence)


@pytest.mark.parametrize(
    ("info", "verdict", "expected"),
    [
        (ExitInfo(0, None, None, None, True), None, None),
        (ExitInfo(0, None, None, None, False), None, "unknown"),  # "No data found" exits 0
        (ExitInfo(0, None, None, None, True), _ev("nan_loss"), "nan_loss"),
        (ExitInfo(1, None, 1, None, False), _ev("cuda_oom"), "cuda_oom"),
        (ExitInfo(1, None, None, 9, False), _ev("cuda_oom"), "cuda_oom"),
        # A line printed before a kill (no traceback of its own) did not end the run: the kill did.
        (ExitInfo(1, None, None, 9, False), _ev("missing_dependency", anchored=False), "host_oom_killed"),
        (ExitInfo(1, None, 2, None, False), _ev("config_error", anchored=False), "config_error"),
        # A rank killed -9: the other ranks' traceback for their lost peer is its consequence, not the cause.
        (ExitInfo(1, None, None, 9, False), _ev("nccl_error", consequence=True), "host_oom_killed"),
        (ExitInfo(1, None, 1, None, False), _ev("nccl_error", consequence=True), "nccl_error"),
        # A rank's segfault: the others' timeout is its consequence; the crash is the cause (no rule names
        # one: restarted as it was, not with a longer timeout). A watchdog's own SIGABRT is the timeout.
        (ExitInfo(None, None, None, 11, False), _ev("nccl_timeout", consequence=True), "unknown"),
        (ExitInfo(1, None, 139, None, False), _ev("nccl_timeout", consequence=True), "unknown"),
        (ExitInfo(1, None, None, 6, False), _ev("nccl_timeout", consequence=True), "nccl_timeout"),
        (ExitInfo(None, None, None, 11, False), _ev("cuda_oom"), "cuda_oom"),
        # The launcher's own SIGKILL after a rank's timeout (Lightning kills its group itself): the timeout.
        (ExitInfo(None, 9, None, None, False), _ev("nccl_timeout", consequence=True), "nccl_timeout"),
        # A finished run is clean whatever it printed on the way; a live fault still counts.
        (ExitInfo(0, None, None, None, True), _ev("missing_dependency", anchored=False), None),
        (ExitInfo(0, None, None, None, True), _ev("cuda_oom"), None),
        (ExitInfo(1, None, None, 9, False), None, "host_oom_killed"),
        (ExitInfo(1, None, 137, None, False), None, "host_oom_killed"),
        (ExitInfo(1, None, -9, None, False), None, "host_oom_killed"),
        (ExitInfo(None, 9, None, None, False), None, "host_oom_killed"),
        (ExitInfo(137, None, None, None, False), None, "host_oom_killed"),
        (ExitInfo(1, None, 1, None, False), None, "unknown"),
        (ExitInfo(None, 15, None, None, False), None, "unknown"),
        (ExitInfo(None, None, None, None, False), None, "unknown"),
        (ExitInfo(0, None, 1, None, True), None, "unknown"),
    ],
)
def test_classify_exit(info: ExitInfo, verdict: Evidence | None, expected: str | None) -> None:
    assert classify_exit(info, verdict) == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("subprocess.CalledProcessError: Command '['python']' returned non-zero exit status 1.", (1, None)),
        ("subprocess.CalledProcessError: Command '['python']' returned non-zero exit status 137.", (137, None)),
        ("subprocess.CalledProcessError: Command '['python']' died with <Signals.SIGKILL: 9>.", (None, 9)),
        ("subprocess.CalledProcessError: Command '['python']' died with <Signals.SIGABRT: 6>.", (None, 6)),
        ("exitcode  : -9 (pid: 5002)", (None, 9)),
        ("exitcode  : 1 (pid: 5002)", (1, None)),
        ("torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) local_rank: 1", (None, 9)),
        ("epoch 1/10", None),
    ],
)
def test_parse_child_status(line: str, expected: tuple[int | None, int | None] | None) -> None:
    assert parse_child_status(line) == expected


def test_scanner_tracks_the_child_status_it_sees() -> None:
    scanner, _ = _scan(["x", "subprocess.CalledProcessError: Command 'y' returned non-zero exit status 1."])
    assert scanner.child_status == (1, None)


# --- user rules -----------------------------------------------------------------------

def test_user_rules_are_validated_into_fault_rules() -> None:
    rules = load_user_rules([{"id": "my_fault", "patterns": ["widget exploded"], "strength": "weak",
                              "restartable": False, "explanation": "The widget exploded.", "live": True}], "p.yaml:3")
    assert rules == (FaultRule("my_fault", ("widget exploded",), (), "weak", False, "The widget exploded.", True),)
    assert load_user_rules(None, "p.yaml") == ()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"id": "x"}, "p.yaml:3: rules: expected a list of mappings, got dict"),
        (["x"], "p.yaml:3: rules[0]: expected a mapping, got str"),
        ([{"id": "a", "patterns": ["ok"]}, {"id": "b", "patterns": ["ok"]},
          {"id": "c", "patterns": ["(unclosed"]}], "p.yaml:3: rules[2].patterns[0]: invalid regex '(unclosed'"),
        ([{"id": "a", "patterns": ["x"], "colour": 1, "pattern": "y"}],
         "p.yaml:3: rules[0]: unknown keys: colour, pattern"),
        ([{"id": "cuda_oom", "patterns": ["x"]}],
         "p.yaml:3: rules[0].id: 'cuda_oom' is a built-in fault; set extends: true"),
        ([{"id": "mine", "patterns": ["x"], "extends": True}], "p.yaml:3: rules[0].extends: 'mine' is not a built-in"),
        ([{"id": "hang", "patterns": ["x"]}], "p.yaml:3: rules[0].id: 'hang' is decided without line rules"),
        ([{"id": "Bad Id", "patterns": ["x"]}], "p.yaml:3: rules[0].id: expected lowercase letters"),
        ([{"id": "a", "patterns": []}], "p.yaml:3: rules[0].patterns: expected a non-empty list of regexes"),
        ([{"id": "a", "patterns": "x"}], "p.yaml:3: rules[0].patterns: expected a non-empty list of regexes"),
        ([{"id": "a", "patterns": ["x"], "excludes": ["[z"]}], "p.yaml:3: rules[0].excludes[0]: invalid regex '[z'"),
        ([{"id": "a", "patterns": ["x"], "strength": "strong"}],
         "p.yaml:3: rules[0].strength: expected 'root' or 'weak'"),
        ([{"id": "a", "patterns": ["x"], "restartable": "yes"}],
         "p.yaml:3: rules[0].restartable: expected true or false"),
        ([{"id": "a", "patterns": ["x"]}, {"id": "a", "patterns": ["y"]}],
         "p.yaml:3: rules[1].id: 'a' is defined twice"),
        ([{"id": "cuda_oom", "extends": True, "patterns": ["x"], "restartable": False}],
         "p.yaml:3: rules[0]: restartable cannot be changed when extending"),
    ],
)
def test_user_rule_errors_name_the_file_item_and_field(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        load_user_rules(data, "p.yaml:3")


def test_extending_a_builtin_adds_its_patterns() -> None:
    (rule,) = load_user_rules([{"id": "cuda_oom", "extends": True, "patterns": ["VRAM exhausted"]}], "p.yaml")
    builtin = next(r for r in BUILTIN_RULES if r.id == "cuda_oom")
    assert rule.patterns == builtin.patterns + ("VRAM exhausted",)
    assert (rule.strength, rule.restartable, rule.explanation) == (builtin.strength, builtin.restartable,
                                                                   builtin.explanation)
    rules = compose_rules((rule,))
    assert len(rules) == len(BUILTIN_RULES) and rules[[r.id for r in rules].index("cuda_oom")] == rule
    verdict = classify_text(["fatal: VRAM exhausted on device 0"], rules)
    assert verdict is not None and verdict.fault == "cuda_oom"


def test_user_faults_come_before_the_builtins_they_are_more_specific_than() -> None:
    mine = load_user_rules([{"id": "bad_kernel", "patterns": ["CUDA error: my custom kernel"]}], "p.yaml")
    verdict = classify_text(["RuntimeError: CUDA error: my custom kernel failed"], compose_rules(mine))
    assert verdict is not None and verdict.fault == "bad_kernel"


def test_user_patterns_without_literals_still_work() -> None:
    # No literal to key on: the pattern is tried on every line (slower, still correct).
    mine = load_user_rules([{"id": "odd", "patterns": [r"\d{3}-\d{3}"], "excludes": ["(?i)ignore"]}], "p.yaml")
    _, new = _scan(["abc 123-456", "IGNORE 999-999"], compose_rules(mine))
    assert [(e.fault, e.lineno) for e in new] == [("odd", 1)]
    mine = load_user_rules([{"id": "shout", "patterns": ["(?i)widget EXPLODED"]}], "p.yaml")
    assert classify_text(["The Widget Exploded"], compose_rules(mine)) is not None


def test_fault_rule_refuses_a_bad_definition() -> None:
    with pytest.raises(ValueError, match="strength"):
        FaultRule("x", ("a",), strength="medium")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("patterns[0]: invalid regex")):
        FaultRule("x", ("(",))
