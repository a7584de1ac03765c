"""Entry point of the SD-style demo trainer (mirrors sd-scripts' `train_network.py`).

Owns only the script identity: the SD architecture (epsilon objective, `_sd.npz`
latent caches, prompts encoded live while sampling, and no text-encoder caching
flags, so `--cache_text_encoder_outputs` is rejected by argparse here).
Run as `python -m trainsup.demo.train_network ...` or as a script path.
"""

from __future__ import annotations

import sys

# absolute imports: the file also runs as a plain script (`launch .../train_network.py`)
from trainsup.demo.cli import parse_command_line


def main(argv: list[str] | None = None) -> None:
    args = parse_command_line(argv, flux=False)
    if args is None:
        sys.exit(1)
    # torch is imported only after the arguments are known to be good
    from trainsup.demo.arch import SD
    from trainsup.demo.core import train

    sys.exit(train(SD, args))


if __name__ == "__main__":
    main()
