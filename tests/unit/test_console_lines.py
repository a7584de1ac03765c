"""What a person reads on trainsup's console: the trainer's output made readable in 100 columns
(``record.readable``), trainsup's lines never on the trainer's (``run.console``), and trainsup's own
lines as sentences with the facts, never ``None`` (``run.sentences``)."""

from __future__ import annotations

import io
import logging
import os
import signal
from pathlib import Path

from trainsup.demo.logfmt import RichLikeHandler, format_meter
from trainsup.faults.scanner import Evidence
from trainsup.record.readable import Readable, readable_line, shorten_bar
from trainsup.record.textfmt import shown_path
from trainsup.run.attempt import AttemptResult
from trainsup.run.console import Console
from trainsup.run.observe import Observations
from trainsup.run.runstate import shown_state
from trainsup.run.sentences import end_sentence, fault_sentence, progress_sentence, remedy_sentence


def rich_record(message: str, columns: int = 250) -> str:
    """A record as the demo (sd-scripts' rich layout) prints it under trainsup's COLUMNS=250."""
    handler = RichLikeHandler(io.StringIO())
    handler.setFormatter(logging.Formatter("%(message)s"))
    os.environ["COLUMNS"], before = str(columns), os.environ.get("COLUMNS")
    try:
        record = logging.LogRecord("x", logging.INFO, "/src/train_network.py", 1234, message, (), None)
        return handler.render(record)
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def test_a_wide_rich_record_reads_in_100_columns() -> None:
    raw = rich_record("model saved.")
    assert len(raw.rstrip("\n")) == 250  # as the trainer wrote it, for parsing
    shown = readable_line(raw.rstrip("\n"))
    assert shown.endswith("INFO     model saved.  train_network.py:1234") and len(shown) < 100
    # a record wrapped over rows: the rows keep their indent, lose their padding
    long = rich_record("word " * 60)
    rows = [readable_line(r) for r in long.rstrip("\n").split("\n")]
    assert rows[0].endswith("train_network.py:1234") and all(r == r.rstrip() for r in rows)
    assert rows[1].startswith(" " * 29) and rows[1].strip().startswith("word")
    # spaces inside a message, and a line that merely ends in a file name, are left alone
    assert readable_line("a   b") == "a   b"
    assert readable_line("see   train.py:12 for it") == "see   train.py:12 for it"


def test_a_wide_bar_is_shortened_to_fit_and_a_narrow_one_is_left() -> None:
    wide = format_meter(5, 10, 2.0, "steps", "avr_loss=0.1").replace("|█████▌    |", "|" + "█" * 110 + " " * 110 + "|")
    shown = shorten_bar(wide, 100)
    assert len(shown) <= 100 and shown.startswith("steps:  50%|") and "| 5/10 [" in shown
    bar = shown.split("|")[1]
    assert abs(bar.count("█") - len(bar) / 2) <= 1  # still half full
    narrow = format_meter(5, 10, 2.0, "steps", "avr_loss=0.1")
    assert shorten_bar(narrow, 100) == narrow


def test_a_stream_of_chunks_cut_anywhere_reads_the_same() -> None:
    raw = (rich_record("loading model") + "\rsteps:  10%|█         | 1/10 [00:01<00:09]   "
           + "\rsteps:  20%|██        | 2/10 [00:02<00:08]\n" + rich_record("saving checkpoint: é ü")).encode()
    whole = Readable()
    expected = whole.feed(raw) + whole.flush()
    for size in (1, 3, 7, 64):
        cut = Readable()
        got = b"".join(cut.feed(raw[i:i + size]) for i in range(0, len(raw), size)) + cut.flush()
        assert got == expected, size
    text = expected.decode()
    assert "loading model  train_network.py:1234\n" in text and "   \rsteps:  20%" in text  # a bar's pad stays
    assert max(len(x) for x in text.replace("\r", "\n").split("\n")) < 100
    odd = b"\xff\xfe half \xe2\x82"  # bytes that are no UTF-8 come out as they went in
    r = Readable()
    assert r.feed(odd) + r.flush() == odd


def test_trainsups_line_never_runs_onto_the_trainers(tmp_path: Path) -> None:
    written: list[tuple[int, bytes]] = []
    err = open(tmp_path / "console", "w", encoding="utf-8")  # noqa: SIM115 - the console's stderr
    fd = err.fileno()
    console = Console(write=lambda f, data: written.append((f, bytes(data))) or os.write(fd, data), err=lambda: err)
    console.echo(fd, b"steps:  50%|#####     | 5/10")  # a bar, drawn with \r, no line end yet
    console.say("trainsup: step 5 is saved (out/x-state)")
    console.echo(fd, b"\rsteps:  60%|######    | 6/10")
    console.echo(fd, b"\n")
    console.say("trainsup: training finished")
    err.close()
    assert (tmp_path / "console").read_bytes().decode() == (
        "steps:  50%|#####     | 5/10\ntrainsup: step 5 is saved (out/x-state)\n"
        "\rsteps:  60%|######    | 6/10\ntrainsup: training finished\n")
    buffer = io.StringIO()  # no descriptor (a test's capture): said as it is
    Console(err=lambda: buffer).say("trainsup: hello")
    assert buffer.getvalue() == "trainsup: hello\n"


def result(fault: str | None, exit_code: int | None = 1, sig: int | None = None) -> AttemptResult:
    return AttemptResult(exit_code=exit_code, signal=sig, obs=Observations(), fault=fault, evidence=None, uptime_s=3.0,
                         stop_signal=None, nan_progress_step=None)


def test_sentences_say_the_facts_and_never_none(tmp_path: Path) -> None:
    log = tmp_path / "attempt-1.log"
    ev = Evidence("cuda_oom", "torch.OutOfMemoryError: CUDA out of memory.\nnext row", 12, "strong")
    said = fault_sentence(2, result("cuda_oom"), ev, log)
    assert said == "attempt 2 ended (exit 1) on a cuda_oom fault: torch.OutOfMemoryError: CUDA out of memory."
    unknown = fault_sentence(1, result("unknown"), None, log)
    assert unknown.startswith("attempt 1 ended (exit 1) on an unknown fault: no line of its output says why")
    assert shown_path(log) in unknown and "None" not in unknown
    killed = fault_sentence(3, result("host_oom_killed", None, signal.SIGKILL), None, log)
    assert killed == "attempt 3 ended (killed by SIGKILL) on a host_oom_killed fault"

    assert end_sentence("stopped", 143, "stopped by SIGTERM") == "stopped by SIGTERM (exit 143)"
    assert end_sentence("gave_up", 3, "restart budget spent: 5 restarts") == \
        "the run failed: restart budget spent: 5 restarts (exit 3)"
    assert end_sentence("stopped", 4, "config_error: the command or its files are wrong") == \
        "the run failed: config_error: the command or its files are wrong (exit 4)"
    assert end_sentence("stopped", 4, None) == "the run failed: no reason recorded (exit 4)"

    assert progress_sentence(1, 120, 1600, 0.0123, 2.0) == "attempt 1: step 120/1600, loss 0.0123, 2 it/s, eta 12m20s"
    assert progress_sentence(2, 7, None, float("nan"), None) == "attempt 2: step 7, loss NaN"
    assert remedy_sentence("cuda_oom", 1, ["--gradient_checkpointing added"], 3, 2.0) == \
        "cuda_oom, remedy 2: --gradient_checkpointing added; attempt 3 starts in 2s"
    assert remedy_sentence("hang", None, [], 2, 0.0) == "hang: the same command again; attempt 2 starts now"


def test_one_vocabulary_for_an_ended_run() -> None:
    assert [shown_state(s, c) for s, c in (("finished", 0), ("gave_up", 3), ("stopped", 4), ("stopped", 143),
                                           ("stopped", 130), ("stopped", 138), ("running", None), ("lost", None))] \
        == ["finished", "failed", "failed", "stopped", "stopped", "stopped", "running", "lost"]


def test_a_path_as_a_person_types_it(tmp_path: Path) -> None:
    assert shown_path(tmp_path / "out" / "x", cwd=tmp_path) == "out/x"
    assert shown_path(tmp_path / "out", cwd=tmp_path / "elsewhere", home=tmp_path) == "~/out"
    assert shown_path("/srv/x", cwd=Path("/"), home=tmp_path) == "/srv/x"


def test_the_pages_log_pane_reads_as_the_console(tmp_path: Path) -> None:
    from trainsup.web.files import log_tail

    raw = rich_record("model saved.") + "steps:  10%|█         | 1/10\rsteps:  20%|██        | 2/10\n"
    (tmp_path / "attempt-1.log").write_text(raw)
    assert [line for _, line in log_tail(tmp_path)][-2:] == [
        raw.split(" INFO")[0] + " INFO     model saved.  train_network.py:1234", "steps:  20%|██        | 2/10"]


def test_the_pages_timeline_says_an_end_in_the_same_words_and_a_skipped_rung_whole() -> None:
    from trainsup.web.runs import timeline

    items = timeline([
        {"event": "remedy_skipped", "class": "cuda_oom", "actions": "set PYTORCH_CUDA_ALLOC_CONF=x", "ts": 1.0},
        {"event": "remedy", "class": "cuda_oom", "actions": ["add --gradient_checkpointing"], "ts": 2.0},
        {"event": "gave_up", "reason": "stopped by SIGTERM", "exit_code": 143, "ts": 3.0},
        {"event": "gave_up", "reason": "restart budget spent", "exit_code": 3, "ts": 4.0},
        {"event": "gave_up", "reason": "config_error: no such file", "exit_code": 4, "ts": 5.0}])
    assert [i.text for i in items] == [
        "remedy skipped for cuda_oom: set PYTORCH_CUDA_ALLOC_CONF=x",
        "remedy for cuda_oom: add --gradient_checkpointing",
        "stopped by SIGTERM", "failed: restart budget spent", "failed: config_error: no such file"]


def test_a_failed_runs_row_says_the_file_its_line_names_and_the_queues_words(tmp_path: Path) -> None:
    import json as json_

    from trainsup.record.journal import Journal
    from trainsup.service.queuestore import QueueStore
    from trainsup.web.app import create_app
    from trainsup.web.auth import Guard, load_token
    from trainsup.web.runs import Catalog

    run_dir = tmp_path / "out" / ".trainsup"
    run_dir.mkdir(parents=True)
    journal = Journal(run_dir)
    journal.status(state="stopped", exit_code=4, reason="config_error: the command or its files are wrong",
                   last_fault="config_error", last_fault_evidence="FileNotFoundError: /m/no-such-model.safetensors")
    journal.close()
    assert json_.loads((run_dir / "status.json").read_text())["state"] == "stopped"  # the supervisor's own word
    state = tmp_path / "state"
    token, _ = load_token(state)
    store = QueueStore(state)
    client = create_app(Catalog({"TRAINSUP_PROJECTS": str(tmp_path / "p")}, store, [run_dir]),
                        Guard(token, "127.0.0.1", 8470), store, {}).test_client()
    page = client.get("/part/runs", headers={"Host": "127.0.0.1:8470"}).get_data(as_text=True)
    assert '<span class="pill failed">failed</span>' in page
    assert "config_error: the command or its files are wrong (FileNotFoundError: /m/no-such-model.safetensors)" in page
