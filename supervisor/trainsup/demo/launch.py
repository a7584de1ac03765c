"""A stand-in for `accelerate launch` with one process (accelerate's simple launcher).

Owns what a supervisor sees of the launcher: the trainer runs as a *child*
python (same interpreter), the launcher neither handles nor forwards SIGTERM or
SIGINT (killing only the launcher orphans the child), and a failed child is
reported the way accelerate reports it: a traceback ending in
`subprocess.CalledProcessError: Command '[...]' returned non-zero exit status N.`
(or `died with <Signals.SIGKILL: 9>.`) and exit status 1, whatever the child's was.

Usage: `python -m trainsup.demo.launch [--num_processes 1] -m MODULE ARGS...`
or `python -m trainsup.demo.launch SCRIPT.py ARGS...`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

# accelerate's warning when launch values come from neither the command line nor a config
_DEFAULTED = {
    "num_processes": "`--num_processes` was set to a value of `1`",
    "num_machines": "`--num_machines` was set to a value of `1`",
    "mixed_precision": "`--mixed_precision` was set to a value of `'no'`",
    "dynamo_backend": "`--dynamo_backend` was set to a value of `'no'`",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="accelerate <command> [<args>] launch", allow_abbrev=False)
    parser.add_argument("--num_processes", type=int, default=None)
    parser.add_argument("--num_machines", type=int, default=None)
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--dynamo_backend", type=str, default=None)
    parser.add_argument("--num_cpu_threads_per_process", type=int, default=None)
    parser.add_argument("--main_process_port", type=int, default=None)
    parser.add_argument("--gpu_ids", type=str, default=None)
    parser.add_argument("-q", "--quiet", action="store_true")
    parser.add_argument("-m", "--module", action="store_true", help="interpret the script as a Python module")
    parser.add_argument("training_script", type=str, help="script (or module with -m) to launch")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


def _warn_defaults(args: argparse.Namespace) -> None:
    warned = [f"\t{text}" for name, text in _DEFAULTED.items() if getattr(args, name) is None]
    if warned and not args.quiet:
        sys.stderr.write(
            "The following values were not passed to `accelerate launch` and had defaults used instead:\n"
            + "\n".join(warned)
            + "\nTo avoid this warning pass in values for each of the problematic parameters or run"
            " `accelerate config`.\n"
        )
        sys.stderr.flush()


def simple_launcher(args: argparse.Namespace) -> tuple[int, list[str]]:
    """Run the child to its end; returns (its return code, the command)."""
    cmd = [sys.executable]
    if args.module:
        cmd.append("-m")
    cmd.append(args.training_script)
    cmd.extend(args.training_script_args)
    env = os.environ.copy()
    env["ACCELERATE_MIXED_PRECISION"] = str(args.mixed_precision or "no")
    if args.num_cpu_threads_per_process is not None:
        env["OMP_NUM_THREADS"] = str(args.num_cpu_threads_per_process)
    # no signal handling on purpose: like accelerate, a SIGTERM ends this process only
    process = subprocess.Popen(cmd, env=env)
    process.wait()
    return process.returncode, cmd


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.num_processes is not None and args.num_processes != 1:
        parser.error(f"the demo launcher runs a single process, not --num_processes {args.num_processes}")
    _warn_defaults(args)
    returncode, cmd = simple_launcher(args)
    if returncode != 0:
        if args.quiet:
            sys.exit(1)
        # uncaught, this prints accelerate's traceback tail and makes the exit status 1
        raise subprocess.CalledProcessError(returncode=returncode, cmd=cmd)
    sys.exit(0)


if __name__ == "__main__":
    main()
