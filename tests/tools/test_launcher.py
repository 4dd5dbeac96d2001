"""The local SuperLink's shutdown (``LocalSimulation.close``), on a fake process tree."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from fedgsp_flwr.tools import launcher
from fedgsp_flwr.tools.launcher import FlwrCli, LocalSimulation, is_running

# A ClientApp worker: on SIGTERM it writes whether the ServerApp process was still there.
CLIENT = """
import signal, sys, time
from pathlib import Path
server, out = int(sys.argv[1]), Path(sys.argv[2])
def state(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except OSError:
        return "gone"
def stopped(*_):
    out.write_text("alive" if state(server) not in ("Z", "gone") else "gone")
    sys.exit(0)
signal.signal(signal.SIGTERM, stopped)
out.with_suffix(".ready").write_text("")
time.sleep(120)
"""

# The SuperLink (its command line names the FLWR_HOME, as the real one's does), with a
# ServerApp process and a ClientApp worker under it.
SUPERLINK = """
import subprocess, sys, time
server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                           "flwr-simulation"])
subprocess.Popen([sys.executable, "-c", sys.argv[1], str(server.pid), sys.argv[2]])
time.sleep(120)
"""


def test_close_kills_the_serverapp_before_any_clientapp_is_stopped(tmp_path: Path) -> None:
    home, out = tmp_path / "home", tmp_path / "client-saw"
    sim = LocalSimulation(tmp_path, home)
    superlink = subprocess.Popen([sys.executable, "-c", SUPERLINK, CLIENT, str(out),
                                  "flower-superlink", str(sim.home)])
    try:
        deadline = time.monotonic() + 30
        while not out.with_suffix(".ready").exists():
            assert time.monotonic() < deadline, "the fake process tree did not start"
            time.sleep(0.05)
        assert sim.superlink_pids() == [superlink.pid]
        sim.close()
        superlink.wait(timeout=30)
        # The ServerApp went first: had it outlived its ClientApps, it would have gone on
        # recording (and checkpointing) rounds that no client answered.
        assert out.read_text() == "gone"
        assert sim.superlink_pids() == [] and not is_running(superlink.pid)
    finally:
        if superlink.poll() is None:
            superlink.kill()


# `flwr`: `run` prints a run id and streams on; `stop <id>` leaves a note of the id.
FAKE_FLWR = """#!{python}
import sys, time
from pathlib import Path
if sys.argv[1] == "stop":
    (Path(__file__).parent / "stopped").write_text(sys.argv[2])
else:
    print("Successfully started run 42", flush=True)
    time.sleep(120)
"""


def test_an_interrupted_launch_kills_its_flwr_run_and_stops_the_run(tmp_path: Path,
                                                                    monkeypatch) -> None:
    """A test's timeout (or Ctrl-C) inside launch() leaves no `flwr run` streaming and
    asks the SuperLink to stop the run."""
    from fedgsp_flwr.tools.launcher import FlwrCli

    fake = tmp_path / "bin" / "flwr"
    fake.parent.mkdir()
    fake.write_text(FAKE_FLWR.format(python=sys.executable))
    fake.chmod(0o755)
    cli = FlwrCli(tmp_path, tmp_path / "home")
    cli.flwr = str(fake)
    log, started = tmp_path / "run.log", []
    wait = subprocess.Popen.wait

    def interrupted_wait(self, timeout=None):
        if timeout is None or started:
            return wait(self, timeout)
        started.append(self)
        deadline = time.monotonic() + 30
        while "started run 42" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        raise KeyboardInterrupt

    monkeypatch.setattr(subprocess.Popen, "wait", interrupted_wait)
    try:
        cli.launch([], {}, log_path=log, timeout=60)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the interruption did not reach the caller")
    assert started and started[0].poll() is not None, "flwr run still streaming"
    assert (fake.parent / "stopped").read_text() == "42"


# A stand-in for the `flwr` CLI: `run` fails as Flower's does when its local SuperLink is
# slow to start, until the attempt given by the file `succeed-at`; `ls` reports the run.
SLOW_SUPERLINK_FLWR = """#!{python}
import json, sys
from pathlib import Path
home = Path(__file__).parent
if sys.argv[1] == "run":
    tries = home / "tries"
    n = int(tries.read_text()) + 1 if tries.exists() else 1
    tries.write_text(str(n))
    if n < int((home / "succeed-at").read_text()):
        print("Starting local SuperLink on 127.0.0.1:9093...")
        print("Failed to start local SuperLink within 15s. See logs at x.")
        sys.exit(1)
    print("Successfully started run 4242")
elif sys.argv[1] == "ls":
    print(json.dumps({{"runs": [{{"status": "finished:completed"}}]}}))
"""


def test_a_run_whose_local_superlink_was_slow_to_start_is_launched_again(
        tmp_path: Path) -> None:
    fake = tmp_path / "flwr"
    fake.write_text(SLOW_SUPERLINK_FLWR.format(python=sys.executable))
    fake.chmod(0o755)
    for succeed_at, status, tries in ((2, "finished:completed", 2),
                                      (launcher.SUPERLINK_START_ATTEMPTS + 1, "not-started",
                                       launcher.SUPERLINK_START_ATTEMPTS)):
        (tmp_path / "tries").unlink(missing_ok=True)
        (tmp_path / "succeed-at").write_text(str(succeed_at))
        cli = FlwrCli(tmp_path, tmp_path / "home")
        cli.flwr = str(fake)
        outcome = cli.launch([], {}, log_path=tmp_path / "run.log", timeout=60)
        assert outcome.status == status
        assert int((tmp_path / "tries").read_text()) == tries


# A stand-in for `flower-superlink`: answers /health on --port after a second, exits, or
# stays silent.
FAKE_SUPERLINK = """#!{python}
import http.server, sys, time
if "{mode}" == "exit":
    sys.exit(3)
if "{mode}" == "silent":
    time.sleep(60)
time.sleep(1)
port = int(sys.argv[sys.argv.index("--port") + 1])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_the_simulation_starts_its_superlink_itself_and_waits_for_it(tmp_path: Path) -> None:
    """Flower's CLI gives up on its local SuperLink after 15 s; LocalSimulation starts
    it with the same command, waits for its health endpoint, and stops it on close."""
    for mode, up in (("serve", True), ("exit", False), ("silent", False)):
        sim = LocalSimulation(tmp_path, tmp_path / f"home-{mode}")
        sim.bin_dir = tmp_path / f"bin-{mode}"
        sim.bin_dir.mkdir()
        fake = sim.bin_dir / "flower-superlink"
        fake.write_text(FAKE_SUPERLINK.format(python=sys.executable, mode=mode))
        fake.chmod(0o755)
        try:
            wait = 30 if mode != "silent" else 1
            assert sim.start_superlink(seconds=wait) is up
            assert sim.superlink_up() is up
            assert len(sim.superlink_pids()) == int(up)  # found by its FLWR_HOME; else gone
            assert sim.start_superlink(seconds=wait) is up  # up: not started twice
            assert len(sim.superlink_pids()) == int(up)
        finally:
            sim.close()
        assert sim.superlink_pids() == [] and not sim.superlink_up()
