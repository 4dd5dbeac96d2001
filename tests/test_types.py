"""mypy on the package (``[tool.mypy]`` in pyproject.toml), as a test of the suite.

Run here rather than before pytest, it takes the CPU the Flower runs leave idle (the
``units`` group, niceness 19) instead of ~28 s of one core while the other waits
(clean clone, 2026-12-03).
"""

from __future__ import annotations

import subprocess
import sys

from helpers import REPO


def test_mypy_finds_no_type_errors_in_the_package() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, f"mypy failed:\n{done.stdout}{done.stderr}"
