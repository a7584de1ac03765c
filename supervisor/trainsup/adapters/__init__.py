"""The trainer adapters, one per family: ``kohya/`` (sd-scripts), ``litgpt/``, ``onetrainer/``,
``command`` (any command) and ``declarative`` (any command plus a project's ``trainer:`` section).

Each is registered under the ``trainsup.trainers`` entry-point group and speaks to the engine only
through the contract in ``trainers.base``; the pieces adapters share live in ``trainers``.

May import ``trainers``, ``faults``, ``sensors`` and ``record``; never ``run``, ``service``,
``commands``, ``web``, ``cli`` or ``demo``. Nothing above imports an adapter (import-linter holds
it: one line for every adapter, present and future).
"""
