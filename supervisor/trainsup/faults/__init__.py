"""Recognising faults in what the trainer prints: the rule table and its prefilter keys, the
streaming scanner and the verdict, line cleaning and splitting, progress and bookkeeping matchers,
reading saved logs, and the remedy ladders for each fault class.

May import ``kohya`` (a log may show the trainer's command line) and ``record``; never ``run``,
``sensors``, ``commands``, ``cli`` or ``demo``.
"""
