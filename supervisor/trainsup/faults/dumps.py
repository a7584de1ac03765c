"""Owns recognising a hung run in the stack dumps people paste with its log (``diagnose`` only).

The live supervisor tells a hang by its progress timer and writes the stacks itself; a pasted log
has no timer, but when it froze people attach what they took from the live process: ``py-spy dump``,
gdb's ``py-bt`` / ``info threads``, ``faulthandler.dump_traceback_later``'s ``Timeout (0:30:00)!``,
or the ``KeyboardInterrupt`` of a Ctrl-C, raised where the process waited.  Those shapes are the
evidence here; a trainer does not print them while it trains, so these rules serve ``diagnose``
and are not part of the live table.
"""

from __future__ import annotations

from .rules import FaultRule

__all__ = ["DUMP_RULES"]

_WAITS = (
    r"^(?:threading|queue|queues|selectors|connection|synchronize|popen_fork|subprocess)\.py ",
    (r" (?:_try_get_data|wait|acquire|join|poll|select|_poll|_recv\w*|barrier|synchronize|all_reduce"
     r"|all_gather\w*|broadcast|recv_forward|send_backward)$"),
)

DUMP_RULES: tuple[FaultRule, ...] = (
    FaultRule(
        id="hang",
        patterns=(
            r"^Thread \d+ \((?:idle|active|gil)\): \"",  # py-spy dump's thread header
            r"^Timeout \(\d+:\d{2}:\d{2}(?:\.\d+)?\)!$",  # faulthandler.dump_traceback_later
            r"^\(gdb\) (?:py-bt|bt|info threads|thread apply all\b|where)",  # a gdb session on the live process
            r"^Traceback \(most recent call first\):$",  # gdb's py-bt
        ),
        explanation="The run stopped making progress while its process lived (the stacks of the hung "
        "process are in the log).",
    ),
    FaultRule(
        id="hang",
        # Ctrl-C on a frozen run: the traceback ends where the process waited (a queue, a lock, a
        # collective); one that ends in computation stopped a healthy run.
        patterns=(r"^KeyboardInterrupt$",),
        frames_require=_WAITS,
        frames_needed=True,
        explanation="The run stopped making progress and was interrupted by hand where it waited.",
    ),
    FaultRule(
        id="hang",
        # The terminal's ^C glued to what the interrupted processes printed next (the main process's
        # and the workers' tracebacks, interleaved, their KeyboardInterrupt lines cut): judged by the
        # frames, as above.
        patterns=(),
        cut_frames=_WAITS,
        cut_hints=(r"^\^C(?:Traceback|Process |Error in |Exception )",),
        explanation="The run stopped making progress and was interrupted by hand where it waited.",
    ),
    FaultRule(
        id="hang",
        # torch warns as each rank enters its first barrier; a log that ends there (other ranks'
        # copies of the warning at most) waited at it and never came back.
        patterns=(
            r"to perform barrier as devices used by this process are currently unknown",
            r"as device used by this process is currently unknown",  # torch 2.5 and later
            r"cause a hang if this rank to GPU mapping is incorrect",  # the warning's row a terminal wrapped
        ),
        strength="weak",
        tail=True,
        explanation="The log ends with the ranks waiting at a process-group barrier: one of them never "
        "reached it (it hung or died without a word).",
    ),
)
