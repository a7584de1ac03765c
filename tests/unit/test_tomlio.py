"""Derived TOML copies: every shape kohya accepts survives, minus exactly the removed keys."""

from __future__ import annotations

import datetime as dt
import json
import tomllib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from trainsup.adapters.kohya import tomlio

KEYS = ["cache_latents", "network_dim", "resolution", "batch_size", "image_dir", "shuffle_caption", "caption"]
SCALARS = st.one_of(
    st.booleans(), st.integers(-10**6, 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12),
    st.datetimes(min_value=dt.datetime(1970, 1, 1), max_value=dt.datetime(2100, 1, 1)).map(
        lambda d: d.replace(microsecond=0, tzinfo=dt.UTC)),
    st.lists(st.integers(0, 9), max_size=3),
)


def _string(value: str, style: int) -> str:
    if style == 1 and "'''" not in value and "\r" not in value and all(c >= " " or c in "\n\t" for c in value) \
            and not value.endswith("'") and "\x7f" not in value:
        return "'''\n" + value + "'''"  # a multi-line literal string
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")  # TOML forbids a raw DEL


def _value(value: Any, style: int) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _string(value, style)
    if isinstance(value, dt.datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v, style) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_value(v, style)}" for k, v in value.items()) + " }"
    return str(value)


@st.composite
def documents(draw: st.DrawFn) -> str:
    """A kohya-shaped TOML text: scalars, dotted keys, inline tables, tables, arrays of tables
    nesting their own arrays of tables (``[[datasets.subsets]]``), and comments."""
    lines = ["# a user's config"]
    used: set[str] = set()

    def scalars(prefix: str) -> None:
        for key in draw(st.lists(st.sampled_from(KEYS), max_size=4, unique=True)):
            if prefix + key in used:
                continue
            used.add(prefix + key)
            style = draw(st.integers(0, 3))
            value = draw(SCALARS)
            if style == 2:  # a dotted key
                lines.append(f"opt.{key} = {_value(value, 0)}  # dotted")
                used.add(prefix + "opt")
            elif style == 3:  # an inline table
                lines.append(f"{key}_inline = {_value({key: value, 'x': 1}, 0)}")
            else:
                lines.append(f"{key} = {_value(value, style)}")

    scalars("")
    if draw(st.booleans()):
        lines.append("\n[general]")
        scalars("general.")
    for _ in range(draw(st.integers(0, 2))):
        lines.append("\n[[datasets]]")
        scalars(f"datasets{len(lines)}.")
        for _ in range(draw(st.integers(0, 2))):
            lines.append("\n  [[datasets.subsets]]  # one folder")
            scalars(f"subsets{len(lines)}.")
    return "\n".join(lines) + "\n"


@settings(max_examples=300, deadline=None)
@given(documents(), st.sets(st.sampled_from(KEYS)))
def test_a_derived_copy_reads_back_as_the_users_document_minus_the_removed_keys(text: str, remove: set[str]) -> None:
    doc = tomlio.parse_toml(text, "user.toml")
    derived = tomlio.derive(doc, remove)
    # (a table left empty may vanish: kohya reads no difference)
    assert tomlio._pruned(tomllib.loads(derived)) == tomlio._pruned(tomlio.without_keys(doc, remove))
    assert not remove & tomlio.keys_anywhere(tomllib.loads(derived))
    if not remove & tomlio.keys_anywhere(doc):
        assert derived == text  # nothing to remove: the user's text, byte for byte


def test_comments_layout_and_every_shape_survive_a_removal() -> None:
    text = ('# tuned for 12 GB\n[model]\npretrained_model_name_or_path = "/m/sd15.safetensors"  # base\n'
            'cache_latents = true\nopt.lr = 1e-4\nwhen = 2024-05-27T07:32:00Z\n'
            'notes = """\nfirst\nsecond"""\n\n[[datasets]]\nresolution = [512, 768]\n'
            'aug = { flip_aug = true, cache_latents = true }\n  [[datasets.subsets]]\n  image_dir = "/img"\n')
    derived = tomlio.derive(tomlio.parse_toml(text, "c.toml"), {"cache_latents"})
    assert derived == text.replace("cache_latents = true\n", "").replace(", cache_latents = true", " ")


def test_unreadable_files_are_named_errors(tmp_path: Any) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"[general\n")
    for path, wording in ((bad, "invalid TOML"), (tmp_path / "none.toml", "not found"), (tmp_path, "directory")):
        try:
            tomlio.read_toml(path)
        except tomlio.ConfigFileError as exc:
            assert str(path) in str(exc) and wording in str(exc)
        else:
            raise AssertionError(f"{path} was read")
    latin = tmp_path / "latin.toml"
    latin.write_bytes('caption = "caf\xe9"\n'.encode("latin-1"))
    try:
        tomlio.read_toml(latin)
    except tomlio.ConfigFileError as exc:
        assert "UTF-8" in str(exc)
