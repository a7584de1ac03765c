"""Owns the exit-code contract of ``trainsup run`` as a scheduler sees it: each code, what it means,
and whether running the job again can help. The docs' table (docs/reference/exit-codes.md), the
Kubernetes example's ``podFailurePolicy`` (``deploy/kubernetes/job.yaml``, checked by a test) and
the sbatch script's comment are read against these names, so a code is written down once here.

The codes themselves are made where they are decided (the engine's ``decide``, ``cli``); this module
names and groups them, and ``remap`` applies the policy's ``exit_codes:`` (a scheduler's own
convention) to the code ``trainsup run`` returns, in ``cli`` only: the journal, ``status.json`` and
``trainsup serve`` keep trainsup's own codes.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass

from ..run.decide import EXIT_GAVE_UP, EXIT_STOPPED
from ..run.policy import EXIT_CODES_ENV, Policy

__all__ = ["CODES", "DEADLINE", "FINISHED", "GAVE_UP", "INTERNAL", "NOT_RETRYABLE", "SIGINT", "SIGTERM",
           "STOPPED_ON_FAULT", "USAGE", "ExitCode", "remap"]

FINISHED = 0
USAGE = 2  # bad usage, policy or project; the run dir is another live supervisor's (lock or lease)
GAVE_UP = EXIT_GAVE_UP  # the restart budget is spent
STOPPED_ON_FAULT = EXIT_STOPPED  # a fault a restart cannot fix
INTERNAL = 70  # EX_SOFTWARE: a bug of trainsup's (cli.EXIT_INTERNAL)
SIGINT = 128 + signal.SIGINT  # 130
DEADLINE = 128 + signal.SIGUSR1  # 138: stopped at the deadline signal (policy slurm.exit_code_after_requeue)
SIGTERM = 128 + signal.SIGTERM  # 143: scancel, a time limit, a pod's deletion, systemctl stop


@dataclass(frozen=True)
class ExitCode:
    code: int
    meaning: str
    retry_helps: bool  # would the same job, started again, get further?


CODES = (
    ExitCode(FINISHED, "training finished", False),
    ExitCode(USAGE, "bad usage, policy or project file; or the run dir is owned by another live trainsup "
             "(its lock, or another host's fresh lease)", False),
    ExitCode(GAVE_UP, "gave up: the restart budget is spent", False),
    ExitCode(STOPPED_ON_FAULT, "stopped on a fault a restart cannot fix", False),
    ExitCode(INTERNAL, "internal error, a bug of trainsup's", True),
    ExitCode(SIGINT, "stopped by SIGINT", True),
    ExitCode(DEADLINE, "stopped at the deadline signal (SIGUSR1) at a complete state, requeued where Slurm "
             "runs it", True),
    ExitCode(SIGTERM, "stopped by SIGTERM", True),
)

# What a scheduler must never run again as it is: it would end the same way.
NOT_RETRYABLE = tuple(c.code for c in CODES if c.code != FINISHED and not c.retry_helps)


def remap(code: int, policy: Policy, env: Mapping[str, str]) -> tuple[int, str | None]:
    """The code ``trainsup run`` exits with for its own ``code`` under the policy's ``exit_codes:``, and
    the key that changed it (None: unchanged). The deadline's own code is 128 + ``slurm.deadline_signal``
    (``slurm.exit_code_after_requeue`` and ``exit_codes.deadline`` are refused together). With
    ``TRAINSUP_EXIT_CODES=native`` (``trainsup serve`` sets it for its entries) nothing is remapped."""
    if env.get(EXIT_CODES_ENV) == "native":
        return code, None
    own = {GAVE_UP: "gave_up", STOPPED_ON_FAULT: "fault", SIGINT: "sigint", SIGTERM: "sigterm",
           128 + signal.Signals[f"SIG{policy.slurm.deadline_signal}"]: "deadline"}
    name = own.get(code)
    given = policy.exit_codes.given()
    if name is None or name not in given:
        return code, None
    return given[name], f"exit_codes.{name}"
