"""Run ``flwr run`` simulations from Python, one after another, and know how they ended.

``flwr run`` auto-starts a local SuperLink that stays up after it exits, keeps the
environment it was started with (runtime dependency installation on or off) and answers
on a fixed port; ``flwr run --stream`` exits 0 even when the run failed.
:class:`LocalSimulation` therefore runs every simulation against a SuperLink of its own
(its own ``FLWR_HOME`` and port, dependency installation off), reads each run's final
status with ``flwr ls``, and stops exactly the SuperLink it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from logging import WARNING
from pathlib import Path
from typing import Any, Self

from flwr.cli.constant import CONTROL_API_PROBE_INTERVAL, CONTROL_API_PROBE_TIMEOUT
from flwr.common.constant import ISOLATION_MODE_SUBPROCESS
from flwr.common.logger import log

# Ray starts its workers (the simulation's ClientApp actors) at niceness 15: they give
# the cores up to any process at 0 (the engine's own threads, the SuperLink, ...), so a
# hop training on all cores stalls at every preemption. Workers at 0 compete fairly.
RAY_NICENESS = "RAY_worker_niceness"
RUN_ID_PATTERN = re.compile(r"Successfully started run (\d+)")
STATUS_COMPLETED = "finished:completed"
# The last line of a Python traceback: "package.module.SomeError: what went wrong".
EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Stalled|Exit)\b[^:\n]*: .+$",
    re.MULTILINE)


@dataclass(frozen=True)
class RunOutcome:
    """How one ``flwr run`` ended.

    Attributes
    ----------
    run_id : str | None
        Flower's run id, ``None`` if the run never started.
    status : str
        Flower's final status (``finished:completed``, ``finished:failed``, ...), or
        ``not-started`` / ``timeout``.
    wall_time : float
        Seconds from launch to exit.
    log_path : Path
        The streamed log of the run.
    """

    run_id: str | None
    status: str
    wall_time: float
    log_path: Path

    @property
    def ok(self) -> bool:
        """Whether the run completed."""
        return self.status == STATUS_COMPLETED

    def cause(self) -> str:
        """Why the run did not complete: the last exception line of its log (e.g. the
        missing-dataset error with its fix), else its status.
        """
        if self.ok:
            return ""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            text = ""
        return failure_cause(text) or f"{self.status} (no exception in the log)"


def failure_cause(log: str) -> str | None:
    """The last exception line (``SomeError: message``) of a run's log, if any."""
    lines = EXCEPTION_LINE.findall(log)
    return lines[-1].strip() if lines else None


# Flower's CLI waits 15 s for the local SuperLink it starts (LOCAL_SUPERLINK_STARTUP_TIMEOUT
# in flwr 1.42), then kills it: too short on a loaded machine (2026-12-02: two e2e runs
# beside an experiment and a CI run). Such a run never started: it is launched again.
SUPERLINK_SLOW_TEXT = "Failed to start local SuperLink within"
SUPERLINK_START_ATTEMPTS = 3
# LocalSimulation starts its SuperLink itself, as Flower's CLI would, and waits this long.
SUPERLINK_START_SECONDS = 120.0


def logged_run_id(log_path: Path) -> str | None:
    """The run id ``flwr run`` printed into its log, ``None`` if it did not start one."""
    match = RUN_ID_PATTERN.search(log_path.read_text(errors="replace"))
    return match.group(1) if match else None


def toml_value(value: Any) -> str:
    """Render a run-config value as the TOML literal ``--run-config`` expects."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value)
    raise TypeError(f"run-config values must be bool, int, float or str, got {value!r}")


def config_string(values: Mapping[str, Any]) -> str:
    """Render a mapping as ``key=value`` pairs for ``--run-config``."""
    return " ".join(f"{key}={toml_value(value)}" for key, value in values.items())


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class FlwrCli:
    """The ``flwr`` CLI under a private ``FLWR_HOME``: launch runs, read their status.

    Parameters
    ----------
    app_dir : str | Path
        The Flower app (folder with ``pyproject.toml``).
    home : str | Path
        ``FLWR_HOME`` of the CLI (connections, state, logs, installed apps).
    """

    def __init__(self, app_dir: str | Path, home: str | Path) -> None:
        self.app_dir = Path(app_dir).resolve()
        self.home = Path(home).resolve()
        self.home.mkdir(parents=True, exist_ok=True)
        self.bin_dir = Path(sys.executable).parent
        self.env = {
            **os.environ,
            "PATH": str(self.bin_dir) + os.pathsep + os.environ.get("PATH", ""),
            "FLWR_HOME": str(self.home),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_TELEMETRY_ENABLED": "0",
            RAY_NICENESS: os.environ.get(RAY_NICENESS, "0"),
        }
        self.flwr = str(self.bin_dir / "flwr")

    def launch(self, args: list[str], run_config: Mapping[str, Any], *,
               log_path: str | Path, timeout: float, connection: str = "",
               app_dir: str | Path | None = None) -> RunOutcome:
        """Run ``flwr run <app> [connection] --stream --run-config ... <args>`` to its end.

        A run that never started because Flower's CLI gave up on starting its local
        SuperLink (``SUPERLINK_SLOW_TEXT``) is launched again, up to
        ``SUPERLINK_START_ATTEMPTS`` times in all.

        Parameters
        ----------
        args : list[str]
            Further ``flwr run`` arguments.
        run_config : Mapping[str, Any]
            Run-config overrides (keys declared by the app).
        log_path : str | Path
            File that receives the streamed log.
        timeout : float
            Seconds before the run is stopped and reported as ``timeout``.
        connection : str
            SuperLink connection of ``FLWR_HOME/config.toml`` ('' for the default).
        app_dir : str | Path | None
            Another Flower app to run than ``self.app_dir`` (``None``: that one).

        Returns
        -------
        RunOutcome
            Run id, final status, wall time and log path.
        """
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, SUPERLINK_START_ATTEMPTS + 1):
            outcome = self._launch_once(args, run_config, log_path, timeout, connection,
                                        app_dir)
            if outcome.run_id is not None or attempt == SUPERLINK_START_ATTEMPTS or (
                    SUPERLINK_SLOW_TEXT not in log_path.read_text(errors="replace")):
                break
            log(WARNING, "flwr run: Flower's CLI did not see its local SuperLink start "
                "within its 15 s (a loaded machine?); launching again (attempt %d of %d, "
                "log %s)", attempt + 1, SUPERLINK_START_ATTEMPTS, log_path)
        return outcome

    def _launch_once(self, args: list[str], run_config: Mapping[str, Any], log_path: Path,
                     timeout: float, connection: str, app_dir: str | Path | None
                     ) -> RunOutcome:
        app = Path(app_dir).resolve() if app_dir is not None else self.app_dir
        cmd = [self.flwr, "run", str(app), *([connection] if connection else []),
               "--stream", "--run-config", config_string(run_config), *args]
        started = time.perf_counter()
        with log_path.open("w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                    cwd=app)
            try:
                proc.wait(timeout=timeout)
                timed_out = False
            except BaseException as err:  # our timeout; Ctrl-C or a test's timeout
                proc.kill()
                proc.wait()
                if not isinstance(err, subprocess.TimeoutExpired):
                    self._stop(logged_run_id(log_path), connection)  # leave no run going on
                    raise
                timed_out = True
        run_id = logged_run_id(log_path)
        if run_id is None:
            status = "not-started"
        elif timed_out:
            self._stop(run_id, connection)
            status = "timeout"
        else:
            status = self.status(run_id, connection)
        return RunOutcome(run_id, status, time.perf_counter() - started, log_path)

    def _stop(self, run_id: str | None, connection: str) -> None:
        """Ask the SuperLink to stop run ``run_id`` (nothing if it never started)."""
        if run_id is not None:
            self.cli("stop", run_id, *([connection] if connection else []))

    def status(self, run_id: str, connection: str = "") -> str:
        """Return Flower's status of a run (``unknown`` if it cannot be read)."""
        out = self.cli("ls", *([connection] if connection else []), "--run-id", run_id,
                       "--format", "json")
        try:
            return str(json.loads(out)["runs"][0]["status"])
        except (json.JSONDecodeError, KeyError, IndexError):
            return "unknown"

    def cli(self, *args: str) -> str:
        """Run one ``flwr`` command under this ``FLWR_HOME`` and return its stdout."""
        result = subprocess.run([self.flwr, *args], capture_output=True, text=True,
                                env=self.env, cwd=self.app_dir, timeout=120, check=False)
        return result.stdout


class LocalSimulation(FlwrCli):
    """A private local SuperLink in simulation mode for sequential ``flwr run`` calls.

    Parameters
    ----------
    app_dir : str | Path
        The Flower app (folder with ``pyproject.toml``).
    home : str | Path
        ``FLWR_HOME`` of the private SuperLink (state, logs, installed apps).
    port : int | None
        Its HTTP port; a free one if ``None``.

    Examples
    --------
    >>> with LocalSimulation(".", "/tmp/flwr-home") as sim:  # doctest: +SKIP
    ...     outcome = sim.run({"num-server-rounds": 2}, num_supernodes=10,
    ...                       log_path=Path("run.log"))
    """

    def __init__(self, app_dir: str | Path, home: str | Path, port: int | None = None) -> None:
        super().__init__(app_dir, home)
        self.port = port or free_port()
        self.control_port = free_port()
        self.env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(self.port)
        self.env["FLWR_LOCAL_CONTROL_API_PORT"] = str(self.control_port)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self,
        run_config: Mapping[str, Any],
        *,
        num_supernodes: int,
        log_path: str | Path,
        client_cpus: float = 1,
        timeout: float = 3 * 3600,
        app_dir: str | Path | None = None,
    ) -> RunOutcome:
        """Run one simulation to its end and return how it ended.

        Parameters
        ----------
        run_config : Mapping[str, Any]
            Run-config overrides (keys declared by the app).
        num_supernodes : int
            Number of simulated SuperNodes.
        log_path : str | Path
            File that receives the streamed log.
        client_cpus : float
            CPUs reserved per ClientApp (1 lets two clients train at once on 2 cores).
        timeout : float
            Seconds before the run is stopped and reported as ``timeout``.
        app_dir : str | Path | None
            Another Flower app to run than ``app_dir`` of the constructor (``None``:
            that one); the SuperLink runs any app.

        Returns
        -------
        RunOutcome
            Run id, final status, wall time and log path.
        """
        federation = f"num-supernodes={num_supernodes} client-resources-num-cpus={client_cpus}"
        self.start_superlink()
        return self.launch(["--federation-config", federation], run_config,
                           log_path=log_path, timeout=timeout, app_dir=app_dir)

    def superlink_up(self) -> bool:
        """Whether this simulation's SuperLink answers on its health endpoint."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health",
                                        timeout=CONTROL_API_PROBE_TIMEOUT) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def start_superlink(self, seconds: float = SUPERLINK_START_SECONDS) -> bool:
        """Start this simulation's SuperLink unless it is up, with the command Flower's
        CLI uses for its local SuperLink, and wait up to ``seconds`` for it to answer;
        ``flwr run`` then finds it running. The CLI itself gives up after 15 s, which a
        loaded machine exceeds. Returns whether it is up; if not, the CLI tries on its
        own (and :meth:`launch` again, up to three times)."""
        if self.superlink_up():
            return True
        folder = self.home / "local-superlink"  # where Flower's CLI keeps its own
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [str(self.bin_dir / "flower-superlink"), "--insecure", "--simulation",
               "--isolation", ISOLATION_MODE_SUBPROCESS,
               "--control-api-address", f"127.0.0.1:{self.control_port}",
               "--host", "127.0.0.1", "--port", str(self.port),
               "--log-file", str(folder / "superlink.log"),
               "--log-rotation-interval-hours", "24", "--log-rotation-backup-count", "7",
               "--database", str(folder / "state.db")]
        proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and proc.poll() is None:
            if self.superlink_up():
                return True
            time.sleep(CONTROL_API_PROBE_INTERVAL)
        cause = (f"it exited with code {proc.returncode}" if proc.poll() is not None else
                 f"it did not answer within {seconds:.0f} s")
        self.close()  # the SuperLink and whatever it started already
        proc.poll()  # reaped
        log(WARNING, "flower-superlink for %s: %s (log %s); leaving the start to flwr run",
            self.home, cause, folder / "superlink.log")
        return False

    def superlink_pids(self) -> list[int]:
        """PIDs of the SuperLink serving this simulation's ``FLWR_HOME``."""
        pattern = f"flower-superlink.*{re.escape(str(self.home))}"
        out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True,
                             check=False).stdout
        return [int(pid) for pid in out.split()]

    def close(self) -> None:
        """Stop the SuperLink this simulation started and every process under it (its
        SuperExec, a running ``flwr-simulation`` and that one's Ray processes, which
        outlive the SuperLink when it stops in the middle of a run).

        A running ``flwr-simulation`` (the ServerApp) is killed first, at once: stopped
        after its ClientApps, or given time to stop, it went on with rounds that no
        ClientApp answered and checkpointed them, so the resumed run built on rounds
        that trained 0-9 of their clients. The rest get SIGTERM, then SIGKILL if still
        there after 10 s.
        """
        for pid in self.superlink_pids():
            tree = descendants(pid)  # before the SuperLink goes and they are re-parented
            kill_servers(tree)
            stop_process(pid)
            for child in reversed(tree):
                stop_process(child, grace=5.0)


SERVER_PROCESS = "flwr-simulation"
"""The process that runs the ServerApp in Flower's simulation engine."""


def kill_servers(pids: list[int]) -> None:
    """SIGKILL the ServerApp processes (``flwr-simulation``) among ``pids`` and wait for
    them to go, so that no round is recorded after this.
    """
    for pid in pids:
        if SERVER_PROCESS in command_line(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _gone_within(pid, 10.0)


def command_line(pid: int) -> str:
    """The command line of process ``pid`` ('' if it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        out = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True,
                             text=True, check=False).stdout
        return out.strip()


def descendants(pid: int) -> list[int]:
    """PIDs of every process under ``pid``, breadth first (``pgrep -P``)."""
    found: list[int] = []
    frontier = [pid]
    while frontier:
        out = subprocess.run(["pgrep", "-P", ",".join(map(str, frontier))],
                             capture_output=True, text=True, check=False).stdout
        frontier = [int(child) for child in out.split()]
        found += frontier
    return found


def stop_process(pid: int, grace: float = 10.0) -> None:
    """SIGTERM ``pid``, then SIGKILL it if it is still there after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        if _gone_within(pid, grace):
            return


def _gone_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` exits within ``seconds`` (a zombie has exited)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not is_running(pid):
            return True
        time.sleep(0.1)
    return False


def is_running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (macOS): alive as far as we can tell
