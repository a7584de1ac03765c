"""Entry point of the Flux-style demo trainer (mirrors sd-scripts' `flux_train_network.py`).

Owns only the script identity: the Flux architecture (flow-matching objective,
`_flux.npz` / `_flux_te.npz` caches, and `--cache_text_encoder_outputs[_to_disk]`,
which encodes captions and sample prompts once at start-up and drops the text
encoder). Run as `python -m trainsup.demo.flux_train_network ...` or as a script path.
"""

from __future__ import annotations

# absolute imports: the file also runs as a plain script (`launch .../flux_train_network.py`)
from trainsup.demo.cli import script_main


def main(argv: list[str] | None = None) -> None:
    script_main(True, argv)


if __name__ == "__main__":
    main()
