"""Owns building what reports on a live run from its policy: the journal listeners for ``notify:``
(``service.alerts``) and ``metrics:`` (``service.metrics``). Nothing is built for a section that is
off, so a run without them starts no thread, opens no port and never imports apprise."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..record.journal import JournalListener
from ..run.policy import Policy
from .alerts import RunAlerts
from .metrics import MetricsListener


def listeners_for(policy: Policy, env: Mapping[str, str] = os.environ,
                  project: str | None = None) -> list[JournalListener]:
    """The listeners ``Supervisor(listeners=...)`` takes for this policy (``project``: the label and the
    name in messages; by default the run's own, from its ``run_start``)."""
    listeners: list[JournalListener] = []
    if policy.notify.urls and policy.notify.on:
        listeners.append(RunAlerts(policy.notify, env, project=project))
    if policy.metrics.listen is not None or policy.metrics.textfile is not None:
        listeners.append(MetricsListener(policy.metrics, project=project))
    return listeners
