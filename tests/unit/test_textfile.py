"""Every text file a person gives trainsup is read one way (``record.textfile``): UTF-8, a byte-order
mark honoured, anything else one error naming the file, the byte and what to do; and the project,
policy and trainer readers turn that error into their own, never a UnicodeDecodeError."""

from __future__ import annotations

import codecs
import json
from pathlib import Path

import pytest

from trainsup.adapters.kohya.prompts import PromptError, parse_prompt_bytes
from trainsup.adapters.kohya.tomlio import ConfigFileError, read_toml
from trainsup.adapters.litgpt.configfile import ConfigFile
from trainsup.adapters.onetrainer.plan import load_config
from trainsup.record.textfile import NotTextError, decode_text, read_text
from trainsup.run.policy import PolicyError, load_policy
from trainsup.run.project import ProjectError, load_project

TEXT = "command: [python, train.py]\ndescription: café crème\n"


@pytest.mark.parametrize("raw", [
    TEXT.encode("utf-8"),
    codecs.BOM_UTF8 + TEXT.encode("utf-8"),
    TEXT.encode("utf-16"),  # Windows Notepad's "Unicode": UTF-16 LE with its mark
    codecs.BOM_UTF16_BE + TEXT.encode("utf-16-be"),
    TEXT.encode("utf-32"),
    codecs.BOM_UTF32_BE + TEXT.encode("utf-32-be"),
], ids=["utf-8", "utf-8-bom", "utf-16-le-bom", "utf-16-be-bom", "utf-32-le-bom", "utf-32-be-bom"])
def test_utf8_and_any_text_with_a_byte_order_mark_is_decoded(raw: bytes) -> None:
    assert decode_text(raw, "p.yaml") == TEXT


@pytest.mark.parametrize(("raw", "reason"), [
    ("a: 1\nb: 2\ndescription: café\n".encode("latin-1"),
     "not UTF-8 text (byte 0xe9 at line 3, column 17); save it as UTF-8"),
    (TEXT.encode("utf-16-le"), "UTF-16 text without a byte-order mark; save it as UTF-8"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "a binary file, not a text project file"),
    (codecs.BOM_UTF16_LE + b"a\x00b",
     "not UTF-16 text though it starts with its byte-order mark (byte 4); save it as UTF-8"),
], ids=["latin-1", "utf-16-without-bom", "binary", "broken-utf-16"])
def test_anything_else_is_one_error_naming_the_file_the_place_and_what_to_do(raw: bytes, reason: str) -> None:
    with pytest.raises(NotTextError) as caught:
        decode_text(raw, "/x/p.yaml", "project file")
    assert str(caught.value) == f"/x/p.yaml: {reason}"
    assert isinstance(caught.value, ValueError)  # callers that turn a ValueError into their own error keep doing so


def test_a_trainers_file_is_read_as_the_trainer_reads_it_plain_utf8() -> None:
    with pytest.raises(NotTextError, match=r"p.txt: UTF-16 text \(it starts with a byte-order mark\), which the "
                                           r"trainer reads as UTF-8; save it as UTF-8"):
        decode_text(TEXT.encode("utf-16"), "p.txt", boms=False)
    assert decode_text(codecs.BOM_UTF8 + b"a", "p.txt", boms=False) == "\ufeffa"  # as the trainer sees it


def test_an_unreadable_file_is_an_oserror_not_a_text_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_text(tmp_path / "nope.yaml")


def test_a_notepad_project_loads_and_a_latin1_or_binary_one_is_a_project_error(tmp_path: Path) -> None:
    notepad = tmp_path / "notepad.yaml"
    notepad.write_bytes(TEXT.encode("utf-16"))
    project = load_project(notepad)
    assert project.command == ("python", "train.py") and project.description == "café crème"
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(TEXT.encode("latin-1"))
    with pytest.raises(ProjectError, match=rf"^{latin}: not UTF-8 text \(byte 0xe9 at line 2, column 17\); "
                                           "save it as UTF-8$"):
        load_project(latin)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(256)))
    with pytest.raises(ProjectError, match=rf"^{binary}: a binary file, not a text project file$"):
        load_project(binary)


def test_a_policy_file_is_read_the_same_way(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes("restart:\n  max: 1\n".encode("utf-16"))
    assert load_policy(path).restart_max == 1
    path.write_bytes("# réglages\nrestart:\n  max: 1\n".encode("latin-1"))
    with pytest.raises(PolicyError, match=rf"^{path}: not UTF-8 text \(byte 0xe9 at line 1, column 4\)"):
        load_policy(path)


def test_a_trainers_prompt_and_config_files_give_their_own_errors_never_a_decode_error(tmp_path: Path) -> None:
    latin = "a: caf\xe9\n".encode("latin-1")
    with pytest.raises(PromptError) as prompt:  # an edit rejected at its line; the run keeps its snapshot
        parse_prompt_bytes(tmp_path / "p.txt", b"a cat\n" + latin)
    reason = "not UTF-8 text (byte 0xe9 at line 2, column 7); save it as UTF-8"
    assert (prompt.value.line, prompt.value.reason) == (2, reason)
    for name, reader, error in (("c.toml", read_toml, ConfigFileError), ("c.yaml", ConfigFile.load, ValueError),
                                ("c.json", load_config, ValueError)):
        path = tmp_path / name
        path.write_bytes(b"\x00\x01\x02")
        with pytest.raises(error, match=rf"^{path}: a binary file, not a text"):
            reader(path)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"a": "é"}), encoding="utf-8")
    assert load_config(good) == {"a": "é"}
