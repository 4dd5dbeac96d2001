"""Write each strategy's checkpoint after round 1 of the hooked run of
``test_resume_identical`` into ``checkpoints-<version>/<strategy>/`` beside this file, as
the app writes it (run from the repository: ``python tests/strategies/data/write_checkpoints.py
0.6.0``). The 0.6.0 files were written at 6ff3bbe, before the state declarations."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE.parent))

import fingerprint  # noqa: F401  (a message's task identity outside a ClientApp)
import test_resume_identical as base
import torch


def main(version: str) -> None:
    torch.set_num_threads(1)
    for name in base.STRATEGIES:
        base.seed_everything()
        federation, strategy = base.Federation(base.FIRST_IDS), base.STRATEGIES[name]()
        folder = HERE / f"checkpoints-{version}" / name
        folder.mkdir(parents=True, exist_ok=True)
        base.start(strategy, federation.grid, base.model_of(0), 1,
                   base.Recorder(strategy, federation, folder, stop=1))


if __name__ == "__main__":
    main(sys.argv[1])
