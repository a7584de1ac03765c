"""Trainers behind one contract: ``base`` (the contract), ``registry`` (adapters found through the
``trainsup.trainers`` entry-point group), the pieces adapters share (``cmdline``, ``interpreter``,
``edits``, ``stepstates``), and one adapter per trainer family: ``kohya/`` (sd-scripts, musubi-tuner),
``litgpt/``, ``command`` (any command) and ``declarative`` (any command plus a project's
``trainer:`` section).

May import ``faults``, ``sensors`` and ``record``; never ``run``, ``service``, ``commands``, ``cli`` or
``demo``. ``run/`` imports ``base`` and ``registry`` only, never an adapter (import-linter holds it).
"""
