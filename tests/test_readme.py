"""README.md stays short, starts with what a reader needs, and its drop-in snippet runs
as written."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from fakegrid import FakeGrid
from flwr.app import Context, RecordDict
from flwr.serverapp import ServerApp
from helpers import node_app, vector_data

README = Path(__file__).resolve().parent.parent / "README.md"
MAX_LINES = 300
EARLY = 80
# Each section and the line it starts with.
SECTIONS = {
    "the strategy table": "## The strategies",
    "install": "## Install",
    "the main job": "**Run the main job.**",
    "the tests": "**Run the tests:**",
    "drop-in use": "## Drop-in use",
}


def readme_lines() -> list[str]:
    return README.read_text().splitlines()


def test_readme_is_short() -> None:
    assert len(readme_lines()) <= MAX_LINES, f"README.md has {len(readme_lines())} lines"


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_section_starts_early(section: str) -> None:
    starts = [i + 1 for i, line in enumerate(readme_lines())
              if line.startswith(SECTIONS[section])]
    assert starts, f"README.md has no line starting {SECTIONS[section]!r} ({section})"
    assert starts[0] <= EARLY, f"{section} starts at line {starts[0]}, after line {EARLY}"


def dropin_code() -> str:
    """The ```python blocks of the drop-in section, joined."""
    text = README.read_text()
    start = text.index(SECTIONS["drop-in use"])
    end = text.find("\n## ", start + 1)
    section = text[start:end if end != -1 else len(text)]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)
    assert blocks, "the drop-in section has no ```python block"
    return "\n".join(blocks)


def test_dropin_snippet_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The snippet builds its ServerApp; its main trains on four in-process nodes (our
    client hooks over 784-feature, 10-class data) and saves the final model."""
    namespace: dict[str, object] = {"__name__": "readme_dropin"}
    exec(compile(dropin_code(), f"{README} (drop-in)", "exec"), namespace)  # noqa: S102
    app, main = namespace["app"], namespace["main"]
    assert isinstance(app, ServerApp) and callable(main)

    def model(*_: object) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))

    grid = FakeGrid({node: node_app(lambda p: vector_data(40, dim=784, classes=10, seed=p),
                                    node, model) for node in range(4)})
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config={"num-server-rounds": 2})
    monkeypatch.chdir(tmp_path)
    main(grid, context)  # type: ignore[operator]

    trained = [m for _, _, kind, m in grid.pushed if kind == "train"]
    assert trained, "the snippet's strategy sent no training message"
    saved = torch.load(tmp_path / "final_model.pt")
    assert sorted(saved) == ["1.bias", "1.weight"]
    assert all(np.isfinite(t.numpy()).all() for t in saved.values())
