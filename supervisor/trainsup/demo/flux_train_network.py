"""Entry point of the Flux-style demo trainer (mirrors sd-scripts' `flux_train_network.py`).

Owns only the script identity: the Flux architecture (flow-matching objective,
`_flux.npz` / `_flux_te.npz` caches, and `--cache_text_encoder_outputs[_to_disk]`,
which encodes captions and sample prompts once at start-up and drops the text
encoder). Run as `python -m trainsup.demo.flux_train_network ...` or as a script path.
"""

from __future__ import annotations

import sys

# absolute imports: the file also runs as a plain script (`launch .../train_network.py`)
from trainsup.demo.cli import parse_command_line


def main(argv: list[str] | None = None) -> None:
    args = parse_command_line(argv, flux=True)
    if args is None:
        sys.exit(1)
    # torch is imported only after the arguments are known to be good
    from trainsup.demo.arch import FLUX
    from trainsup.demo.core import train

    sys.exit(train(FLUX, args))


if __name__ == "__main__":
    main()
