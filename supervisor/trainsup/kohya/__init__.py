"""What the trainer is and how its files look: kohya command lines and script profiles (flags,
state names), TOML configs and their derived copies, saved states and safetensors headers, weights,
caches, sample-prompt files, and the trainer's own interpreter.

May import ``record``; never ``run``, ``faults``, ``sensors``, ``commands``, ``cli`` or ``demo``.
"""
