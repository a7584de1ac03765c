"""What trainsup writes down: the journal and status snapshot, the step ledger, and the file
primitives (temp-and-replace writes) every derived file goes through.

Imports no other group.
"""
