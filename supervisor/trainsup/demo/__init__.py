"""A tiny kohya-compatible trainer (real torch on CPU) used by `trainsup demo` and the tests.

Entry points: `train_network` (SD-style), `flux_train_network` (Flux-style),
`launch` (accelerate's single-process launcher), `make_assets` (models, dataset,
prompts). The engine: `cli` (flags, TOML), `prepare` (set-up), `core` (loop,
resume arithmetic, saves), `state` (state dirs), `sampling`, `data`, `model`,
`network` (LoRA), `arch` (SD vs Flux), `faults` (simulated GPU faults),
`logfmt` (rich/tqdm-style console), `png`.
"""
