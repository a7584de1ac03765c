"""The command line's defaults are named once (``cli``'s constants) and agree with the defaults of the
library calls behind them, so a default changed in one place cannot leave the other saying the old one."""

from __future__ import annotations

from pathlib import Path

from trainsup import cli
from trainsup.commands.slurm import DEFAULT_LEAD_S, ScriptOptions
from trainsup.service.daemon import ServeOptions


def _defaults(*argv: str) -> dict[str, object]:
    return vars(cli._parser().parse_args(list(argv)))


def test_the_parser_takes_each_default_from_its_constant() -> None:
    assert _defaults("stop", "x")["timeout"] == cli.STOP_TIMEOUT_S
    assert _defaults("serve")["min_free_mib"] == cli.MIN_FREE_MIB
    assert _defaults("web")["listen"] == cli.WEB_LISTEN
    assert _defaults("slurm", "p")["lead"] == cli.SLURM_LEAD_S


def test_the_library_defaults_agree_with_the_command_line() -> None:
    assert ServeOptions(Path("/q")).min_free_mib == cli.MIN_FREE_MIB
    assert ScriptOptions().lead_s == DEFAULT_LEAD_S == cli.SLURM_LEAD_S


def test_the_help_says_the_default_it_uses() -> None:
    text = cli._parser()._subparsers._group_actions[0].choices["serve"].format_help()  # type: ignore[union-attr]
    assert f"(default {cli.MIN_FREE_MIB})" in " ".join(text.split())
