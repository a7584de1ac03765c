"""The verbs beside ``run``, one module each: ``diagnose`` (saved logs, offline), ``doctor`` (a command
before it runs; the trainer's own checks are its adapter's), ``status``, ``logs`` and ``stop`` (a
run from outside, through its run dir; ``runref`` finds the run an argument names, ``pidcheck``
tells whether a pid is still the supervisor before ``stop`` or ``stop ID`` signals it) and
``service`` (the systemd unit and a project's installation) and ``queue`` (the entries ``trainsup
serve`` runs, and ``stop ID``). ``cli`` parses argv for them and exits.

May import ``service``, ``run``, ``trainers`` (the contract, the registry and the shared pieces; never an
adapter), ``faults``, ``sensors``, ``record``, and the demo's argument parser (to know the demo scripts'
flags); never ``cli``.
"""
