"""The supervise loop and its edges: the engine and one attempt, the decision and the launch plan,
preparing the first launch, live edits of the run's inputs, resume points, the run's states, the
child process and its output pumps, what the output tells, and the policy file.

May import ``faults``, ``kohya``, ``sensors`` and ``record``; never ``commands``, ``cli`` or ``demo``.
"""
