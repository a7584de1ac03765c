"""The supervise loop and its edges: the engine and one attempt, the decision, remedies and the
launch plan, preparing the first launch, project files, live edits of the run's inputs, resume
points, claiming a run dir (lock and lease: ``ownership``) and taking it over from a dead
supervisor, the GPU guard, systemd's notify protocol, the run's states, the child process and its
output pumps, what the output tells, and the policy file.

May import ``faults``, ``kohya``, ``sensors`` and ``record``; never ``commands``, ``cli`` or ``demo``.
"""
