"""The chaos soak of `benchmarks/chaos.py`, split by role (`python benchmarks/chaos.py` is the entry
point; the soak and its six invariants are described there):

- `params`: the fixed shape (fault kinds, demo size and pacing, bounds, file names, the demo argv);
- `plan`: the per-run seeds and each run's injections, all drawn from its seed;
- `driver`: one supervised run (`ChaosRun`): start trainsup, fire the injections, restart it;
- `checks`: the six invariants, checked after a run;
- `references`: the weights of uninterrupted runs that invariant 1 compares with;
- `procwatch`: the process-table sampler behind invariant 4;
- `filler`: the full disk (a filler file on the output dir's tmpfs; kept full for the `journal` moment);
- `files`: digests, state dirs, whole or half-written saves, the journal and the ledger as read back;
- `report`: the steps-redone figures, the summary and its table.

The real mode (`--real-kohya`, sd-scripts' train_network.py on the CPU bed of tests/real) reuses the
above and adds:

- `real_bed`: the bed (tests/real/bed.py), the one bare reference run, the bed's processes;
- `real_driver`: `RealRun`, the driver's loop over the real trainer (its faults, its save moment);
- `real_checks`: its five invariants (finished, exact steps, names, weights, processes).
"""
