"""The supervise loop and its edges. The loop: ``engine`` (attempts, decisions, remedies, the run's
end) over typed ``events``, polling one ``attempt`` at a time; ``context`` (what a run holds open and
closes), ``launching`` (one attempt's launch), ``reactions`` (what the output and an attempt's end mean
to the engine), ``decide`` (the pure decision), ``remedy`` and ``ending``. Its edges: project files and
the policy, live edits of the run's inputs, claiming a run dir (lock and lease: ``ownership``) and
taking it over from a dead supervisor, the GPU guard, the deadline, systemd's notify protocol, the
child process and its output pumps, and what the output tells (``observe``).

May import ``trainers`` (the contract and the registry, never an adapter), ``faults``, ``sensors`` and
``record``; never ``adapters``, ``service``, ``commands``, ``web``, ``cli`` or ``demo``.
"""
