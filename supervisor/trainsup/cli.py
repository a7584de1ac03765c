"""Owns the command line: argument parsing, signal handlers, exit codes. The only place that exits.

Exit codes of ``trainsup run``: 0 training finished; 2 bad usage or policy; 3 gave up after the
restart budget; 4 stopped on a fault a restart cannot fix; 130/143 stopped by SIGINT/SIGTERM.
``trainsup diagnose``: 0 every log classified; 2 an input could not be read (or bad options);
141 its reader went away (``| head``).
``trainsup doctor``: 0 no findings; 1 warnings only; 2 blockers (or bad usage).
``trainsup demo``: 0 every run finished; 2 its directory cannot be used; 3 a run did not finish.
Any verb: 130 interrupted; 70 an internal error, a bug of trainsup's, reported as one line
(``TRAINSUP_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainsup", description="Supervise kohya-style training runs.")
    parser.add_argument("--version", action="version", version=f"trainsup {__version__}")
    sub = parser.add_subparsers(dest="verb", required=True)
    run = sub.add_parser("run", help="launch a training command and bring it back from known faults",
                         usage="trainsup run [--policy FILE] [--run-dir DIR] [--quiet] -- COMMAND...")
    run.add_argument("--policy", type=Path, help="YAML policy (see config.example.yaml)")
    run.add_argument("--run-dir", type=Path, help="where logs and the journal go "
                     "(default: OUTPUT_DIR/.trainsup, or ./.trainsup)")
    run.add_argument("--quiet", action="store_true", help="do not pass the trainer's output through")
    run.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after --")
    diag = sub.add_parser("diagnose", help="classify saved training logs offline and say what run would change",
                          usage='trainsup diagnose [--json] [--command "..."] [--policy FILE] LOG...')
    diag.add_argument("--json", action="store_true", help="one JSON object per line per log")
    diag.add_argument("--command", help="the training command the logs came from, to print it corrected")
    diag.add_argument("--policy", type=Path, help="YAML policy whose user rules are applied first")
    diag.add_argument("logs", nargs="+", metavar="LOG", help="log files; - reads stdin")
    doctor = sub.add_parser("doctor", help="check a training command and its environment before running it",
                            usage="trainsup doctor [--json] -- COMMAND...")
    doctor.add_argument("--json", action="store_true", help="one JSON object with every finding")
    doctor.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after --")
    demo = sub.add_parser("demo", help="run the built-in demo: four real faults, detected and recovered")
    demo.add_argument("--keep", type=Path, help="keep the demo's files in this directory")
    demo.add_argument("--verbose", action="store_true", help="show the trainer's own output")
    return parser


EXIT_INTERNAL = 70  # EX_SOFTWARE
EXIT_BROKEN_PIPE = 141  # as a shell reports a reader that went away (128 + SIGPIPE)


def main(argv: list[str] | None = None) -> int:
    """Every way trainsup stops is an exit code and at most one ``trainsup: error: ...`` line."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("trainsup: error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # the last line of defence: a user never sees a traceback of ours
        if os.environ.get("TRAINSUP_DEBUG"):
            raise
        print(f"trainsup: error: internal error ({type(exc).__name__}: {exc}); this is a bug in trainsup, "
              "please report it (TRAINSUP_DEBUG=1 shows where)", file=sys.stderr)
        return EXIT_INTERNAL


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.verb == "run":
        return _run(args)
    if args.verb in ("diagnose", "doctor"):
        try:
            return _report(args)
        except BrokenPipeError:
            # The reader went away (`trainsup diagnose big.log | head`): not an error of ours.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_BROKEN_PIPE
    if args.verb == "demo":
        from .demo.story import run_demo

        return run_demo(args.keep, args.verbose)
    return 2


def _report(args: argparse.Namespace) -> int:
    if args.verb == "diagnose":
        from .commands.diagnose import run_diagnose

        return run_diagnose(args.logs, as_json=args.json, command=args.command, policy=args.policy,
                            out=sys.stdout, err=sys.stderr)
    from .commands.doctor import run_doctor

    command = _training_command(args, "doctor")
    if command is None:
        return 2
    return run_doctor(command, as_json=args.json, cwd=Path.cwd(), env=dict(os.environ), out=sys.stdout)


def _training_command(args: argparse.Namespace, verb: str) -> list[str] | None:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print(f"trainsup {verb}: error: give the training command after `--`", file=sys.stderr)
        return None
    return command


def _run(args: argparse.Namespace) -> int:
    from .run.engine import RunSpec, Supervisor, install_signal_handlers
    from .run.policy import PolicyError, load_policy

    command = _training_command(args, "run")
    if command is None:
        return 2
    try:
        policy = load_policy(args.policy)
    except PolicyError as exc:
        print(f"trainsup run: error: {exc}", file=sys.stderr)
        return 2
    spec = RunSpec(tuple(command), Path.cwd(), args.run_dir, dict(os.environ), not args.quiet, args.policy)
    supervisor = Supervisor(spec, policy)
    install_signal_handlers(supervisor)
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
