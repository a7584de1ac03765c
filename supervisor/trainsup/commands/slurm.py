"""Owns ``trainsup slurm``: the sbatch script that runs a project as a Slurm batch job.

``trainsup slurm PROJECT [--lead S] [--singleton] [--output-script PATH] [--submit] [SBATCH_OPTION...]``
writes ``PATH`` (default ``./NAME.sbatch``): ``--job-name`` from the project, ``--output`` into the
project's run dir (``slurm-%j.out``; the directory is made, as Slurm opens the file before the
script runs), ``--open-mode=append`` and ``--requeue`` (a requeued job keeps its id and its log),
``--signal=B:USR1@LEAD`` (only the batch shell gets it), ``--dependency=singleton`` on request, the
user's sbatch options as further ``#SBATCH`` lines, and ``exec TRAINSUP run --project FILE`` with
this installation's trainsup and the project file's absolute path: trainsup *is* the batch shell
and alone receives the signal. ``--submit`` then runs ``sbatch PATH``.

Its second line marks the file as written here, with the sha256 of every other line: the file is
rewritten only while that sum matches, so an edited script, or anyone else's file, is never
replaced. Errors are one line each (``SlurmError``); the CLI prints them as
``trainsup slurm: error: ...``. Exit codes: 0 written (and submitted); 1 ``--submit``: sbatch is
missing or failed (the script is written and kept); 2 bad usage, an unknown or invalid project, a
file that is not an unedited script of ``trainsup slurm``, or one that cannot be written.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..record.fsutil import atomic_write_text
from ..run.project import Project, ProjectError, find_project, load_project
from .exitcodes import NOT_RETRYABLE, SIGTERM
from .service import trainsup_exec

__all__ = ["DEFAULT_LEAD_S", "MARK", "ScriptOptions", "SlurmError", "is_ours", "run_slurm", "script_text",
           "write_script"]

EXIT_OK = 0
EXIT_SBATCH = 1  # --submit: sbatch is not there, or it refused the script (it said why on its stderr)
EXIT_USAGE = 2
DEFAULT_LEAD_S = 300  # --signal=B:USR1@300: Slurm sends it 300 to 330 s before the time limit
MAX_LEAD_S = 65535  # Slurm keeps the signal's time in 16 bits
MARK = "# trainsup-slurm sha256="
_MARK_RE = re.compile(r"^# trainsup-slurm sha256=([0-9a-f]{64})\b")
# Options the script sets that a user's option replaces (short and long spelling).
_REPLACEABLE = {"-J": "--job-name", "--job-name": "--job-name", "-o": "--output", "--output": "--output"}
# Options that would break what the script is for.
_REFUSED = {
    "--signal": "the script sets --signal=B:USR1@LEAD; use --lead S",
    "--no-requeue": "the deadline signal requeues the job; it needs --requeue",
    "--open-mode": "the script appends to the job's log across requeues (--open-mode=append)",
    "--wrap": "the script's body is `exec trainsup run --project ...`",
}


class SlurmError(Exception):
    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ScriptOptions:
    lead_s: int = DEFAULT_LEAD_S
    singleton: bool = False
    sbatch: tuple[str, ...] = ()  # the user's sbatch options, as given


def sbatch_lines(words: Sequence[str]) -> list[list[str]]:
    """The user's sbatch options grouped one option a line: ``--time=4:00:00``, ``-p gpu``."""
    lines: list[list[str]] = []
    for word in words:
        if word.startswith("-") and word not in ("-", "--"):
            lines.append([word])
        elif word == "--":
            continue
        elif lines and len(lines[-1]) == 1 and _takes_next(lines[-1][0]):
            lines[-1].append(word)
        else:
            raise SlurmError(f"{word!r} is not an sbatch option; give sbatch options after the project, one "
                             "value each (--time=4:00:00, -p gpu)")
    return lines


def _takes_next(option: str) -> bool:
    """Whether the next word may be this option's value: ``--time 4:00:00``, ``-p gpu``; not after
    ``--time=4:00:00`` or ``-pgpu``."""
    return "=" not in option if option.startswith("--") else len(option) == 2


def _option_name(word: str) -> str:
    if word.startswith("--"):
        return word.split("=", 1)[0]
    return word[:2]


def script_text(project: Project, exec_argv: Sequence[str], log_dir: Path | None, opts: ScriptOptions) -> str:
    """The whole script, marked line included; ``log_dir`` is where ``--output`` goes unless the user
    gave one."""
    if not 1 <= opts.lead_s <= MAX_LEAD_S:
        raise SlurmError(f"--lead {opts.lead_s}: Slurm takes 1 to {MAX_LEAD_S} seconds")
    user = sbatch_lines(opts.sbatch)
    given = {_option_name(line[0]) for line in user}
    for name in given:
        if name in _REFUSED:
            raise SlurmError(f"sbatch option {name} is not passed through: {_REFUSED[name]}")
    if opts.singleton and given & {"-d", "--dependency"}:
        raise SlurmError("--singleton beside --dependency: add singleton to your --dependency list instead "
                         "(--dependency=afterok:123,singleton)")
    replaced = {_REPLACEABLE[n] for n in given if n in _REPLACEABLE}
    ours = []
    if "--job-name" not in replaced:
        ours.append(f"--job-name={shlex.quote(project.name)}")
    if "--output" not in replaced:
        if log_dir is None:
            raise SlurmError("no directory for the job's log; give --output=FILE")
        ours.append(f"--output={shlex.quote(str(log_dir / 'slurm-%j.out'))}")
    ours += ["--open-mode=append", "--requeue", f"--signal=B:USR1@{opts.lead_s}"]
    if opts.singleton:
        ours.append("--dependency=singleton")
    body = [
        "#!/bin/bash",
        f"# Project {project.name}: {project.path}",
        "# Written by `trainsup slurm`; edit it freely (trainsup slurm then never rewrites it). trainsup",
        f"# is the batch shell (exec below), so Slurm's USR1, {opts.lead_s} s before the time limit, reaches",
        "# trainsup alone: it stops the trainer at a complete state and requeues this job (same id, log",
        f"# appended); the next run resumes. scancel and the time limit send SIGTERM: exit {SIGTERM}.",
        f"# Exits {', '.join(map(str, NOT_RETRYABLE))} mean a rerun cannot help (docs/guides/slurm.md).",
        *(f"#SBATCH {line}" for line in ours),
    ]
    if user:
        body.append("# Your sbatch options:")
        body += [f"#SBATCH {' '.join(shlex.quote(w) for w in line)}" for line in user]
    body += ["", f"exec {shlex.join([*exec_argv, 'run', '--project', str(project.path)])}", ""]
    rest = "\n".join(body)
    first, _, tail = rest.partition("\n")
    return f"{first}\n{MARK}{_digest(first, tail)}\n{tail}"


def _digest(first: str, tail: str) -> str:
    return hashlib.sha256(f"{first}\n{tail}".encode()).hexdigest()


def is_ours(text: str) -> bool | None:
    """True: an unedited script of ``trainsup slurm``; False: one it wrote, edited since; None: not one
    it wrote."""
    first, _, rest = text.partition("\n")
    mark, _, tail = rest.partition("\n")
    found = _MARK_RE.match(mark)
    if found is None:
        return None
    return found.group(1) == _digest(first, tail)


def write_script(path: Path, text: str) -> bool:
    """Write ``text`` at ``path`` unless a file there is not an unedited script of ours; False when it
    already held ``text``."""
    try:
        old = path.read_text(encoding="utf-8") if path.exists() else None
    except (OSError, UnicodeDecodeError) as exc:
        raise SlurmError(f"{path} exists and cannot be read as a script ({exc}); move it away, or give "
                         "--output-script another path") from None
    if old == text:
        return False
    if old is not None:
        ours = is_ours(old)
        if ours is None:
            raise SlurmError(f"{path} exists and was not written by trainsup slurm; move it away, or give "
                             "--output-script another path")
        if not ours:
            raise SlurmError(f"{path} was edited since trainsup slurm wrote it; it is left as it is (submit "
                             f"it with sbatch {shlex.quote(str(path))}, or remove it to have it written anew)")
    try:
        atomic_write_text(path, text)
        os.chmod(path, 0o755)
    except OSError as exc:
        raise SlurmError(f"cannot write {path} ({exc.strerror or exc})") from None
    return True


def _log_dir(project: Project) -> Path:
    folder = project.resolved_run_dir(exact=True)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SlurmError(f"cannot make {folder}, where the job's log goes ({exc.strerror or exc}); set "
                         f"run_dir: in {project.path}, or give --output=FILE") from None
    return folder


Runner = Callable[[Sequence[str]], int]


def _sbatch(argv: Sequence[str]) -> int:
    return subprocess.run(list(argv), check=False).returncode


def run_slurm(name: str, opts: ScriptOptions, script: Path | None, submit: bool, out: TextIO,
              runner: Runner = _sbatch, which: Callable[[str], str | None] = shutil.which) -> int:
    try:
        project = load_project(find_project(name))
    except ProjectError as exc:
        raise SlurmError(str(exc)) from None
    path = (script if script is not None else Path(f"{project.name}.sbatch")).absolute()
    log_dir = None
    if not any(_option_name(line[0]) in ("-o", "--output") for line in sbatch_lines(opts.sbatch)):
        log_dir = _log_dir(project)
    text = script_text(project, trainsup_exec(), log_dir, opts)
    written = write_script(path, text)
    print(f"{'wrote' if written else 'unchanged:'} {path}", file=out)
    if not submit:
        print(f"submit it with: sbatch {shlex.quote(str(path))}", file=out)
        return EXIT_OK
    sbatch = which("sbatch")
    if sbatch is None:
        raise SlurmError(f"--submit: sbatch is not on PATH; {path} is written, submit it where Slurm's "
                         "clients are installed", EXIT_SBATCH)
    out.flush()
    try:
        code = runner([sbatch, str(path)])
    except OSError as exc:
        raise SlurmError(f"--submit: cannot run {sbatch} ({exc.strerror or exc}); {path} is written",
                         EXIT_SBATCH) from None
    if code != 0:
        raise SlurmError(f"--submit: sbatch exited {code} (its message is above); {path} is kept",
                         EXIT_SBATCH)
    return EXIT_OK
