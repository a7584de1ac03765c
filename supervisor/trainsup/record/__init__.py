"""What trainsup writes down: the journal and status snapshot, the step ledger, and the file
primitives (temp-and-replace writes) every derived file goes through; and how a duration and a
run's progress are worded (``textfmt``), the same wherever they are shown.

Imports no other group.
"""
