"""The sd-scripts adapter (kohya-ss sd-scripts; musubi-tuner, ``adapters.musubi``, reuses its modules
through ``dialect``): ``adapter`` is its contract side; the rest is what the trainer is and how its
files look: script profiles (flags, state names), the launch plan and its first form (``plan``,
``prepare``), TOML configs and their derived copies, saved states and safetensors headers, resume
points, weights, caches, sample-prompt files, the output lines and the live inputs, and ``trainsup
doctor``'s checks (``doctor``, ``doctor_checks``).
"""
