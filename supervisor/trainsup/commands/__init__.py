"""The verbs beside ``run``, one module each: ``diagnose`` (saved logs, offline) and ``doctor``
(with its checks: a command before it runs). ``cli`` parses argv for them and exits.

May import ``run``, ``faults``, ``kohya``, ``sensors``, ``record``, and the demo's argument parser
(to know the demo scripts' flags); never ``cli``.
"""
