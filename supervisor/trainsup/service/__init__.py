"""The box's long-running side: the queue daemon (``trainsup serve``) and its queue files, and what
tells people and dashboards about runs: notifications (apprise) and Prometheus metrics.

May import ``run``, ``trainers`` (the contract and the registry; never an adapter), ``faults``,
``sensors`` and ``record``; never ``commands``, ``cli`` or ``demo``. The daemon starts each
queued run as its own ``trainsup run --project`` process, so it never imports torch.
"""
