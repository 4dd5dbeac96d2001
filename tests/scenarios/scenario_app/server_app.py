"""The bundled app's ServerApp, several runs in one ``flwr run``.

Each scenario of the run config's ``scenarios-file`` (a JSON list of ``{"name": ...,
"run-config": {...}}``) is one call of :func:`fedgsp_flwr.app.server_app.run` with the
shared run config (``dataset``, ``partition``: what the nodes read) overridden by its
own keys, exactly as ``flwr run --run-config`` would give them to the bundled app. A
scenario that raises is recorded and the next one runs. After each scenario,
``<out-dir>/<name>.json`` holds whether it completed, its error, the lines the
``flwr`` logger emitted meanwhile and its results folder's metrics as it left them; ``<out-dir>/summary.json`` lists the scenarios run.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedgsp_flwr.app.config import RunConfig
from fedgsp_flwr.app.results import read_metrics
from fedgsp_flwr.app.server_app import run
from fedgsp_flwr.threads import server_work

app = ServerApp()


class Lines(logging.Handler):
    """Collects the lines of the ``flwr`` logger (INFO and worse)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def run_scenario(grid: Grid, shared: dict[str, Any], scenario: dict[str, Any],
                 out: Path) -> dict[str, Any]:
    """Run one scenario; return (and write to ``<out>/<name>.json``) its outcome."""
    name = scenario["name"]
    lines = Lines()
    logger = logging.getLogger("flwr")
    logger.addHandler(lines)
    started = time.perf_counter()
    row: dict[str, Any] = {"name": name, "completed": False, "error": "", "traceback": ""}
    try:
        cfg = RunConfig.from_mapping({**shared, **scenario["run-config"]})
        with server_work(grid, cfg.server_threads or None):
            folder = run(grid, cfg)
        row["folder"], row["metrics"] = str(folder), read_metrics(folder)
        row["completed"] = True
    except Exception as err:  # noqa: BLE001 - recorded; the next scenario runs
        row["error"] = f"{type(err).__name__}: {err}"
        row["traceback"] = traceback.format_exc()[-4000:]
    finally:
        logger.removeHandler(lines)
    row["wall-time"] = time.perf_counter() - started
    row["lines"] = lines.lines
    (out / f"{name}.json").write_text(json.dumps(row, indent=1))
    return row


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run every scenario in turn."""
    shared = {k: v for k, v in context.run_config.items()
              if k not in ("scenarios-file", "out-dir")}
    scenarios = json.loads(Path(str(context.run_config["scenarios-file"])).read_text())
    out = Path(str(context.run_config["out-dir"])).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    done = []
    for scenario in scenarios:
        done.append(run_scenario(grid, shared, scenario, out)["name"])
        (out / "summary.json").write_text(json.dumps(done))
