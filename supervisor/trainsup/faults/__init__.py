"""Recognising faults in what a trainer prints, knowing no trainer: the rule table and its prefilter
keys, the streaming scanner and the verdict, line cleaning and splitting, reading saved logs, the
trainer-neutral progress value (``progress``), each fault class's properties (``classes``), and the
neutral default remedy ladder with the ladder machinery every adapter's own ladders use.

A trainer's line formats (progress, success) reach the scanner as a ``progress.ProgressFormat`` the
caller passes in; its ladders and its own rules live in its adapter.  May import ``record``; never
``trainers``, ``adapters``, ``run``, ``sensors``, ``commands``, ``cli`` or ``demo``.
"""
