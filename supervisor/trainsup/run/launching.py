"""Owns making one attempt's launch from the plan: the adapter's command (and the derived copies it
writes), the child's environment, ``attempt_start`` journaled and said; or, when the launch's files
cannot be written, the stop (nothing is launched without them, nothing of the user's is touched).
"""

from __future__ import annotations

import errno

from ..record import journalkinds as kinds
from ..record.ledger import StateRecord
from ..record.textfmt import shown_path
from ..sensors.ranks import is_launcher
from ..trainers.base import Plan
from ..trainers.debris import set_aside_write_debris
from .attempt import AttemptSpec
from .context import RunContext, say
from .decide import EXIT_STOPPED, Decision
from .live import LiveControl
from .policy import Policy
from .reactions import Reactions
from .spec import CHILD_ENV_DEFAULTS, NCCL_DUMPS, SUPERVISOR_ONLY_ENV, flight_recorder_env


def prepare_launch(ctx: RunContext, plan: Plan, policy: Policy, live: LiveControl, reactions: Reactions,
                   attempt: int, resume: StateRecord | None) -> AttemptSpec | Decision:
    """Attempt ``attempt`` from ``resume`` (``None``: the beginning), ready to start."""
    t, spec = ctx.trainer, ctx.spec
    launch = plan.copy()
    try:
        live.before_launch(attempt)
        launched = t.launch(launch, attempt, resume, ctx.run_dir)
    except OSError as exc:
        fault = "disk_full" if exc.errno == errno.ENOSPC else "config_error"
        return Decision(kind="stop", exit_code=EXIT_STOPPED, reason=f"{fault}: cannot write this launch's "
                        f"files in {ctx.run_dir}: {exc.strerror or exc}")
    if attempt > 1:
        since = ctx.ledger.run_started()
        if since is not None:  # what this run's killed attempts left half-written beside their states
            set_aside_write_debris(t.output_dirs(), since, ctx.run_dir, attempt, ctx.journal, say)
    ctx.points.begin(attempt, launched)  # the ledger knows the attempt before it runs
    argv = list(launched.argv)
    resume_step = resume.step if resume else 0
    reactions.begin(attempt, resume_step)
    recorder = flight_recorder_env(ctx.run_dir) if is_launcher(argv) else {}
    if recorder:
        try:
            (ctx.run_dir / NCCL_DUMPS).mkdir(exist_ok=True)
        except OSError:
            pass  # no dumps then; the launch itself does not need the folder
    env = {k: v for k, v in {**CHILD_ENV_DEFAULTS, **recorder, **spec.env, **launched.env}.items()  # the user's win
           if k not in SUPERVISOR_ONLY_ENV}
    ctx.journal.event(kinds.ATTEMPT_START, attempt=attempt, argv=argv, resume_from=resume.dir if resume else None,
                      resume_step=resume_step, env=dict(launched.env))
    say(f"attempt {attempt} starts from step {resume_step} ({shown_path(resume.dir)})" if resume else
        f"attempt {attempt} starts from the beginning")
    ctx.status(state="running", attempt=attempt, step=resume_step, total=t.total_steps, run_dir=str(ctx.run_dir))
    return AttemptSpec(argv=argv, env=env, cwd=spec.cwd, log_path=ctx.run_dir / f"attempt-{attempt}.log",
                       grace_s=policy.stop_grace_s, pump_wait_s=policy.pump_wait_s, echo=spec.echo,
                       hang=policy.hang, fmt=t.output, planned_signal=t.planned_stop_signal, before=launched.before)
