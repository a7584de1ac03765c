"""Entry point of the SD-style demo trainer (mirrors sd-scripts' `train_network.py`).

Owns only the script identity: the SD architecture (epsilon objective, `_sd.npz`
latent caches, prompts encoded live while sampling, and no text-encoder caching
flags, so `--cache_text_encoder_outputs` is rejected by argparse here).
Run as `python -m trainsup.demo.train_network ...` or as a script path.
"""

from __future__ import annotations

# absolute imports: the file also runs as a plain script (`launch .../train_network.py`)
from trainsup.demo.cli import script_main


def main(argv: list[str] | None = None) -> None:
    script_main(False, argv)


if __name__ == "__main__":
    main()
