"""Owns the command line: argument parsing, signal handlers, exit codes. The only place that exits.

Exit codes of ``trainsup run``: 0 training finished; 2 bad usage or policy; 3 gave up after the
restart budget (or, after a deadline signal, the requeue budget: ``slurm.requeue_budget``); 4 stopped on a
fault a restart cannot fix; 130/143 stopped by SIGINT/SIGTERM (never requeued); 138 stopped at the
deadline signal (SIGUSR1 by default; requeued inside a Slurm job; ``slurm.exit_code_after_requeue``).
The policy's ``exit_codes:`` remaps 3, 4, 130, 143 and 138 (``_run``'s end, ``commands.exitcodes.remap``).
``trainsup diagnose``: 0 every log classified; 2 an input could not be read (or bad options);
141 its reader went away (``| head``).
``trainsup doctor``: 0 no findings; 1 warnings only; 2 blockers (or bad usage).
``trainsup demo``: 0 every run finished; 2 its directory cannot be used (``--keep``: one that is not
empty and is no earlier demo's); 3 a run did not finish.
``trainsup status``: 0 every run reported (whatever its state); 2 an argument names no run dir or project.
``trainsup logs``: 0 printed (with ``-f``: until the run ended); 1 no such log (never launched, no
attempt N, unreadable); 2 no such run; 130 interrupted (quietly); 141 its reader went away.
``trainsup stop``: 0 the supervisor stopped, or none was running; 1 it is still running (not stopped
within ``--timeout``, or its pid could not be signalled); 2 no such run.
``trainsup service``: 0 done; 1 a ``systemctl`` command of ``--enable`` failed; 2 bad usage, an invalid
project file, a different file of that name already installed, or a file that cannot be written.
``trainsup serve``: 0 stopped by SIGTERM/SIGINT (running entries requeued); 2 bad usage, the state
directory cannot be used, or another daemon holds it.
``trainsup queue``: 0 done; 1 refused (removing or moving a running entry, retrying one that did not
fail or stop); 2 bad usage, no such entry, an invalid project file, a project ``trainsup doctor`` finds
would fail at its start (``add``/``retry`` without ``--force``), or a state directory that cannot be used.
``trainsup stop ID`` (a queue entry): 0 stopped, or it was not running; 1 still running.
``trainsup web``: 0 stopped by SIGTERM/SIGINT; 2 bad usage, an address that cannot be listened on, or a
token file that cannot be kept.
``trainsup slurm``: 0 the script written (and submitted); 1 ``--submit``: sbatch missing or failed; 2 bad
usage, an unknown or invalid project, or a file there that is not an unedited script of ``trainsup slurm``.
Any verb: 130 interrupted; 70 an internal error, a bug of trainsup's, reported as one line
(``TRAINSUP_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from . import __version__

if TYPE_CHECKING:
    from .run.project import Project
from .commands.argtypes import at_least_one, seconds

# The verbs' defaults, each named once: the parser and its help read them from here.
STOP_TIMEOUT_S = 120.0  # above the default stop.grace_s (30 s): the supervisor waits that long for the trainer
MIN_FREE_MIB = 2048  # a GPU with less free memory gets no queue entry (service.daemon.ServeOptions's too)
WEB_LISTEN = "127.0.0.1:8470"
SLURM_LEAD_S = 300  # commands.slurm.DEFAULT_LEAD_S: a test holds the two together

_COUNT, _ATTEMPT = at_least_one(), at_least_one("an attempt number")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainsup", description="Supervise training runs (sd-scripts, LitGPT, "
                                     "any command): recognise faults, resume from the last safe state.")
    parser.add_argument("--version", action="version", version=f"trainsup {__version__}")
    sub = parser.add_subparsers(dest="verb", required=True)
    run = sub.add_parser("run", help="launch a training command and bring it back from known faults",
                         usage="trainsup run [--policy FILE] [--trainer NAME] [--run-dir DIR] [--quiet] "
                               "[--fresh | --resume] -- COMMAND...\n"
                               "       trainsup run --project NAME_OR_FILE [--run-dir DIR] [--quiet] "
                               "[--fresh | --resume]")
    run.add_argument("--policy", type=Path, help="YAML policy (see config.example.yaml)")
    run.add_argument("--project", metavar="NAME_OR_FILE", help="run a project file (its command, "
                     "environment and policy); a name is looked up in the projects directory")
    run.add_argument("--trainer", metavar="NAME", help="the trainer adapter to use (kohya, litgpt, command, ...; "
                     "default: the one that recognises the command)")
    run.add_argument("--run-dir", type=Path, help="where logs and the journal go "
                     "(default: OUTPUT_DIR/.trainsup, or ./.trainsup)")
    run.add_argument("--quiet", action="store_true", help="do not pass the trainer's output through")
    start = run.add_mutually_exclusive_group()
    start.add_argument("--fresh", action="store_true", help="start this run over in a run dir of its own, "
                       "even where its states lie (everything that exists is kept)")
    start.add_argument("--resume", action="store_true", help="resume this run, or fail when nothing of it is there")
    run.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after --")
    diag = sub.add_parser("diagnose", help="classify saved training logs offline and say what run would change",
                          usage='trainsup diagnose [--json] [--command "..."] [--policy FILE] LOG|RUN_DIR...')
    diag.add_argument("--json", action="store_true", help="one JSON object per line per log")
    diag.add_argument("--command", help="the training command the logs came from, to print it corrected")
    diag.add_argument("--policy", type=Path, help="YAML policy whose user rules are applied first")
    diag.add_argument("logs", nargs="+", metavar="LOG|RUN_DIR", help="log files (- reads stdin), or a run dir (or "
                      "output dir): its attempt logs in order, each with what the run then did, from its journal")
    doctor = sub.add_parser("doctor", help="check a training command and its environment before running it",
                            usage="trainsup doctor [--json] -- COMMAND...\n"
                                  "       trainsup doctor [--json] --project NAME_OR_FILE")
    doctor.add_argument("--json", action="store_true", help="one JSON object with every finding")
    doctor.add_argument("--project", metavar="NAME_OR_FILE", help="check a project file's command, from its "
                        "directory with its environment and trainer (a name is looked up in the projects directory)")
    doctor.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after --")
    status = sub.add_parser("status", help="show where runs stand (every project when none is named)",
                            usage="trainsup status [--json] [--state DIR] [PROJECT|RUN_DIR|ID ...]")
    status.add_argument("--json", action="store_true", help="one JSON array, an object per run")
    status.add_argument("--state", type=Path, metavar="DIR",
                        help="the queue's state directory, whose queue is shown too (default: trainsup serve's)")
    status.add_argument("runs", nargs="*", metavar="PROJECT|RUN_DIR|ID",
                        help="a project (name or file), a run dir (or the output dir holding it), or a queue entry's "
                             "id; none: every run started on this box in the last week, every project and the queue")
    logs = sub.add_parser("logs", help="print a run's trainer log, or follow it",
                          usage="trainsup logs [-f] [--attempt N] [--state DIR] PROJECT|RUN_DIR|ID")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="keep printing as the run goes, through later attempts, until it ends")
    logs.add_argument("--attempt", type=_ATTEMPT, metavar="N", help="attempt N's log (default: the newest)")
    logs.add_argument("--state", type=Path, metavar="DIR", help="the queue's state directory, for an entry ID")
    logs.add_argument("run", metavar="PROJECT|RUN_DIR|ID",
                      help="a project (name or file), a run dir (or the output dir holding it), or a queue entry's id")
    stop = sub.add_parser("stop", help="ask a run's supervisor (or a queue entry) to stop, and wait until it has",
                          usage="trainsup stop [--timeout S] [--state DIR] PROJECT|RUN_DIR|ID")
    stop.add_argument("--state", type=Path, metavar="DIR", help="the queue's state directory, for an entry ID")
    stop.add_argument("--timeout", type=seconds, default=STOP_TIMEOUT_S, metavar="S",
                      help="how long to wait for it (default %(default)g s; it waits stop.grace_s for the trainer)")
    stop.add_argument("run", metavar="PROJECT|RUN_DIR|ID",
                      help="a project (name or file), a run dir (or the output dir holding it), or a queue entry's id")
    serve = sub.add_parser("serve", help="the box's daemon: work through the queue of projects",
                           usage="trainsup serve [--state DIR] [--slots N] [--min-free-mib MIB] [--policy FILE] "
                                 "[--web ADDR]")
    serve.add_argument("--state", type=Path, metavar="DIR", help="the queue's state directory (default: "
                       "$TRAINSUP_STATE, else /var/lib/trainsup for root, else ~/.local/state/trainsup)")
    serve.add_argument("--slots", type=_COUNT, metavar="N",
                       help="entries run at once (default: one per GPU, or 1 without GPUs)")
    serve.add_argument("--min-free-mib", type=_COUNT, default=MIN_FREE_MIB, metavar="MIB",
                       help="a GPU with less free memory than this gets no entry (default %(default)s)")
    serve.add_argument("--policy", type=Path, metavar="FILE",
                       help="YAML whose notify: and metrics: sections the daemon uses (see config.example.yaml)")
    serve.add_argument("--web", metavar="ADDR",
                       help=f"also serve the page (as trainsup web) on ADDR, e.g. {WEB_LISTEN}")
    web = sub.add_parser("web", help="a page in the browser over the runs: loss, samples, faults, logs, the queue",
                         usage="trainsup web [--listen ADDR] [--state DIR] [--projects DIR] [RUN_DIR ...]")
    web.add_argument("--listen", default=WEB_LISTEN, metavar="ADDR",
                     help="HOST:PORT (default %(default)s; beyond loopback every page needs the token)")
    web.add_argument("--state", type=Path, metavar="DIR", help="the queue's state directory, whose queue is shown "
                     "and where the token is kept (default: trainsup serve's)")
    web.add_argument("--projects", type=Path, metavar="DIR", help="the projects directory whose projects are "
                     "shown (default: $TRAINSUP_PROJECTS, else ~/.config/trainsup/projects, /etc/... for root)")
    web.add_argument("runs", nargs="*", type=Path, metavar="RUN_DIR", help="more run dirs (or output dirs) to show, "
                     "besides every project and queue entry")
    queue = sub.add_parser("queue", help="add, list, reorder and pause the entries trainsup serve runs")
    queue_sub = queue.add_subparsers(dest="queue_verb", required=True)
    q_add = queue_sub.add_parser("add", help="queue a project (a name or a file); prints the entry's id",
                                 usage="trainsup queue add [--state DIR] [--gpus LIST] [--priority P] [--force] "
                                       "PROJECT")
    q_add.add_argument("--gpus", metavar="LIST", help="run it on these GPUs (indices or UUIDs, comma-separated)")
    q_add.add_argument("--priority", type=int, default=0, metavar="P", help="higher starts first (default 0)")
    q_add.add_argument("--force", action="store_true", help="queue it even when trainsup doctor finds that it "
                       "would fail at its start (its blockers are said as warnings)")
    q_add.add_argument("project", metavar="PROJECT", help="a project name (in the projects directory) or file; "
                       "trainsup doctor checks it first")
    q_retry = queue_sub.add_parser("retry",
                                   help="queue a failed or stopped entry again, as a new entry that resumes it",
                                   usage="trainsup queue retry [--state DIR] [--force] ID")
    q_retry.add_argument("--force", action="store_true", help="queue it even when trainsup doctor finds blockers")
    q_retry.add_argument("id", metavar="ID", help="the ended entry (its project file is read again, as it is now)")
    q_list = queue_sub.add_parser("list", help="every entry and how it stands, when it started and ended",
                                  usage="trainsup queue list [--state DIR] [--json]")
    q_list.add_argument("--json", action="store_true", help="one JSON array, an object per entry")
    q_remove = queue_sub.add_parser("remove", help="take a waiting or ended entry off the queue",
                                    usage="trainsup queue remove [--state DIR] ID")
    q_remove.add_argument("id", metavar="ID", help="the entry's id (q1, q2, ...)")
    q_move = queue_sub.add_parser("move", help="put a queued entry at another place",
                                  usage="trainsup queue move [--state DIR] ID --to POS")
    q_move.add_argument("id", metavar="ID", help="the entry's id (q1, q2, ...)")
    q_move.add_argument("--to", type=_COUNT, required=True, metavar="POS", help="1 is next to start")
    queue_sub.add_parser("pause", help="start nothing new; running entries finish",
                         usage="trainsup queue pause [--state DIR]")
    queue_sub.add_parser("resume", help="start entries again", usage="trainsup queue resume [--state DIR]")
    for verb_parser in queue_sub.choices.values():
        verb_parser.add_argument("--state", type=Path, metavar="DIR", help="the queue's state directory")
    service = sub.add_parser("service", help="run projects under systemd: print the unit, install a project")
    service_sub = service.add_subparsers(dest="service_verb", required=True)
    unit = service_sub.add_parser("unit", help="print the trainsup@.service unit for this installation",
                                  usage="trainsup service unit [--user]")
    unit.add_argument("--user", action="store_true", help="the unit for a user manager (systemctl --user)")
    install = service_sub.add_parser("install", help="install a project file and the unit",
                                     usage="trainsup service install [--user] [--enable] PROJECT_FILE")
    install.add_argument("--user", action="store_true", help="for your user manager (systemctl --user)")
    install.add_argument("--enable", action="store_true", help="run systemctl daemon-reload and enable --now")
    install.add_argument("project", type=Path, metavar="PROJECT_FILE")
    slurm = sub.add_parser("slurm", help="write (or submit) the sbatch script that runs a project as a Slurm job",
                           usage="trainsup slurm [--lead S] [--singleton] [--output-script PATH] [--submit] "
                                 "PROJECT [SBATCH_OPTION...]", allow_abbrev=False,
                           epilog="Options trainsup does not know are sbatch's, written as #SBATCH lines; give "
                                  "them after PROJECT, a value joined by '=' (--time=04:00:00).")
    slurm.add_argument("--lead", type=_COUNT, default=SLURM_LEAD_S, metavar="S", help="the deadline signal comes S "
                       "seconds (to S+30) before the time limit: --signal=B:USR1@S (default %(default)s)")
    slurm.add_argument("--singleton", action="store_true",
                       help="--dependency=singleton: one job of this name (and user) runs at a time")
    slurm.add_argument("--output-script", type=Path, metavar="PATH", help="where the script goes "
                       "(default ./PROJECT.sbatch); never over a file trainsup slurm did not write")
    slurm.add_argument("--submit", action="store_true", help="then submit it with sbatch")
    slurm.add_argument("project", metavar="PROJECT", help="a project name or file, as for run --project")
    demo = sub.add_parser("demo", help="run the built-in demo: four real faults, detected and recovered")
    demo.add_argument("--keep", type=Path, metavar="DIR", help="keep the demo's files in this directory (a new or "
                      "empty one, or an earlier demo's, whose runs are replaced)")
    demo.add_argument("--verbose", action="store_true", help="show the trainer's own output")
    return parser


def _verb_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the verb (and sub-verb) given: an error says that verb's usage, not trainsup's."""
    found = parser
    for dest in ("verb", "queue_verb", "service_verb"):
        name = getattr(args, dest, None)
        subs = [a for a in found._actions if isinstance(a, argparse._SubParsersAction)]
        if name is None or not subs or name not in subs[0].choices:
            break
        found = subs[0].choices[name]
    return found


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
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if args.verb == "slurm":
        return _slurm(args, unknown)
    if unknown:  # as parse_args says it, with the verb's own usage
        _verb_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.verb == "run":
        return _run(args, argv)
    if args.verb in ("diagnose", "doctor"):
        try:
            return _report(args)
        except BrokenPipeError:
            # The reader went away (`trainsup diagnose big.log | head`): not an error of ours.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_BROKEN_PIPE
    if args.verb in ("status", "logs", "stop"):
        try:
            return _runs(args)
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_BROKEN_PIPE
        except KeyboardInterrupt:
            if args.verb != "logs":
                raise
            return 130  # Ctrl-C is how `logs -f` is meant to end: no message
    if args.verb == "service":
        return _service(args)
    if args.verb == "serve":
        return _serve(args)
    if args.verb == "web":
        from .web.server import run_web

        return run_web(args.listen, args.state, args.projects, args.runs, os.environ)
    if args.verb == "queue":
        from .commands.queue import run_queue

        return run_queue(args.queue_verb, state=args.state, env=os.environ, out=sys.stdout, err=sys.stderr,
                         project=getattr(args, "project", None), gpus=getattr(args, "gpus", None),
                         priority=getattr(args, "priority", 0), entry_id=getattr(args, "id", None),
                         to=getattr(args, "to", None), as_json=getattr(args, "json", False),
                         force=getattr(args, "force", False))
    if args.verb == "demo":
        from .demo.story import run_demo

        return run_demo(args.keep, args.verbose)
    return 2


def _service(args: argparse.Namespace) -> int:
    from .commands.service import ServiceError, run_install, run_unit

    try:
        if args.service_verb == "unit":
            return run_unit(args.user, os.environ, sys.stdout)
        return run_install(args.project, args.user, args.enable, os.environ, sys.stdout)
    except ServiceError as exc:
        print(f"trainsup service: error: {exc}", file=sys.stderr)
        return exc.code


def _slurm(args: argparse.Namespace, sbatch: list[str]) -> int:
    from .commands.slurm import ScriptOptions, SlurmError, run_slurm

    try:
        return run_slurm(args.project, ScriptOptions(args.lead, args.singleton, tuple(sbatch)),
                         args.output_script, args.submit, sys.stdout)
    except SlurmError as exc:
        print(f"trainsup slurm: error: {exc}", file=sys.stderr)
        return exc.code


def _serve(args: argparse.Namespace) -> int:
    from .run.policy import PolicyError, load_policy
    from .service.daemon import Daemon, ServeOptions, install_signal_handlers
    from .service.queuestore import state_dir

    try:
        policy = load_policy(args.policy)
    except PolicyError as exc:
        print(f"trainsup serve: error: {exc}", file=sys.stderr)
        return 2
    daemon = Daemon(ServeOptions(state_dir(args.state), args.slots, args.min_free_mib, env=dict(os.environ),
                                 policy=policy))
    install_signal_handlers(daemon)
    if args.web is None:
        return daemon.run()
    from .web.server import beside  # the page, from a thread of its own beside the queue's loop

    return beside(args.web, state_dir(args.state), os.environ, daemon.run)


def _report(args: argparse.Namespace) -> int:
    if args.verb == "diagnose":
        from .commands.diagnose import run_diagnose

        return run_diagnose(args.logs, as_json=args.json, command=args.command, policy=args.policy,
                            out=sys.stdout, err=sys.stderr)
    from .commands.doctor import run_doctor

    if args.project is not None:
        project = _project_of(args, "doctor", "the command", [a for a in args.command if a != "--"])
        if project is None:
            return 2
        return run_doctor(list(project.command), as_json=args.json, cwd=project.cwd, env=dict(os.environ),
                          out=sys.stdout, project=project)
    command = _training_command(args, "doctor")
    if command is None:
        return 2
    return run_doctor(command, as_json=args.json, cwd=Path.cwd(), env=dict(os.environ), out=sys.stdout)


def _runs(args: argparse.Namespace) -> int:
    if args.verb == "status":
        from .commands.status import run_status

        return run_status(args.runs, as_json=args.json, env=os.environ, out=sys.stdout, err=sys.stderr,
                          state=args.state)
    if args.verb == "logs":
        from .commands.logs import run_logs
        from .commands.queue import find_entry

        found = find_entry(args.run, os.environ, args.state)
        if found is not None:  # a queue entry's id: its run dir
            args.run = found[1].run_dir
        return run_logs(args.run, attempt=args.attempt, follow=args.follow, env=os.environ,
                        out=sys.stdout.buffer, err=sys.stderr)
    from .commands.queue import find_entry, stop_entry
    from .commands.stop import run_stop

    found = find_entry(args.run, os.environ, args.state)
    if found is not None:  # a queue entry's id
        return stop_entry(*found, timeout=args.timeout, out=sys.stdout, err=sys.stderr)
    return run_stop(args.run, timeout=args.timeout, env=os.environ, out=sys.stdout, err=sys.stderr)


def _training_command(args: argparse.Namespace, verb: str) -> list[str] | None:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print(f"trainsup {verb}: error: give the training command after `--`", file=sys.stderr)
        return None
    return command


def _project_of(args: argparse.Namespace, verb: str, what: str, given: object, nor: str = "") -> Project | None:
    """The project ``--project`` names, or None after one error line:
    ``given`` is what the command line gave beside it, which the project file holds instead."""
    from .run.project import ProjectError, find_project, load_project

    if given:
        print(f"trainsup {verb}: error: --project takes {what} from the project file; give no command after "
              f"--{nor}", file=sys.stderr)
        return None
    try:
        return load_project(find_project(args.project))
    except ProjectError as exc:
        print(f"trainsup {verb}: error: {exc}", file=sys.stderr)
        return None


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    from .run.engine import Supervisor
    from .run.policy import PolicyError, load_policy
    from .run.spec import RunSpec

    start_mode: Literal["auto", "fresh", "resume"] = "fresh" if args.fresh else "resume" if args.resume else "auto"
    if args.project is not None:
        given = [a for a in args.command if a != "--"] or args.policy is not None or args.trainer is not None
        project = _project_of(args, "run", "the command, the policy and the trainer", given,
                              ", no --policy and no --trainer")
        if project is None:
            return 2
        spec = RunSpec(project.command, project.cwd, args.run_dir or project.run_dir,
                       project.child_env(os.environ), not args.quiet, project.path, project, start=start_mode)
        policy = project.policy
    else:
        command = _training_command(args, "run")
        if command is None:
            return 2
        try:
            policy = load_policy(args.policy)
        except PolicyError as exc:
            print(f"trainsup run: error: {exc}", file=sys.stderr)
            return 2
        spec = RunSpec(tuple(command), Path.cwd(), args.run_dir, dict(os.environ), not args.quiet, args.policy,
                       trainer=args.trainer, start=start_mode)
    from .service.reporting import listeners_for  # notify: and metrics: (nothing when they are off)

    supervisor = Supervisor(spec, policy, listeners=listeners_for(policy, os.environ))
    for sig in (signal.SIGINT, signal.SIGTERM):  # the handlers only record: the decision loop acts
        signal.signal(sig, lambda signum, _frame: supervisor.request_stop(signum))
    signal.signal(supervisor.deadline.signum, supervisor.deadline.signalled)  # Slurm's warning (run.deadline)
    signal.signal(signal.SIGCONT, lambda _signum, _frame: None)  # Slurm sends it before each signal: nothing
    code = supervisor.run()
    if supervisor.reexec_env is not None:
        # The project's command was edited: a new supervisor on the edited file takes the run over
        # (same pid, so systemd keeps its main process; the run dir's lock is inherited, held
        # throughout) and resumes from the checkpoint just made.
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, "-m", "trainsup.cli", *argv],
                  {**os.environ, **supervisor.reexec_env})
    from .commands.exitcodes import remap  # the policy's exit_codes: (a scheduler's convention)

    mapped, key = remap(code, supervisor.policy, os.environ)
    if key is not None:
        print(f"trainsup: exit={code} exits {mapped} ({key})", file=sys.stderr, flush=True)
    return mapped


if __name__ == "__main__":
    sys.exit(main())
