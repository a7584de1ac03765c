"""What trainsup watches besides the trainer's output: the file watcher (watchdog) and the GPU
probe (NVML behind a small protocol).

May import ``record``; never ``run``, ``trainers``, ``adapters``, ``faults``, ``commands``, ``cli`` or
``demo``.
"""
