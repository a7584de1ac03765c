"""The trainer contract and the pieces adapters share: ``base`` (the contract), ``registry``
(adapters found through the ``trainsup.trainers`` entry-point group), ``cmdline``, ``interpreter``,
``edits``, ``stepstates`` (the default state store), ``ledgerstates``, ``accelerate`` (the
``save_state`` format) and ``sthead`` (safetensors headers). The adapters themselves live in
``trainsup.adapters``.

May import ``faults``, ``sensors`` and ``record``; never ``adapters``, ``run``, ``service``,
``commands``, ``cli`` or ``demo``. ``run/`` imports ``base`` and ``registry`` only, never an adapter
(import-linter holds it).
"""
