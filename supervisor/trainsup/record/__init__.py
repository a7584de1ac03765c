"""What trainsup writes down: the journal and status snapshot, the step ledger (trainer-neutral:
which state holds which absolute step; an adapter's own facts of an attempt are notes it alone
reads), the run dir's lock and, for a run dir on shared storage, the host identity and lease (``lease``), and the file
primitives (temp-and-replace writes) every derived file goes through; how a person's text file is
read (``textfile``: UTF-8, a byte-order mark honoured, anything else refused naming the file); and
how a duration and a run's progress are worded (``textfmt``), the same wherever they are shown.

Imports no other group.
"""
