"""The local-federation launcher's defaults are safe: TLS and SuperNode authentication
unless ``--insecure``; private keys that never exist with group or other permission
bits, whatever the umask; SIGTERM and SIGHUP stop every process it started, as Ctrl-C
does.

The stop path is checked on the launcher's own code (``main``, ``LocalFederation``'s
node and close logic) with stand-in processes for the SuperLink and the SuperNodes, each
with a child (a SuperNode's SuperExec); one test marked ``deployment`` does it with the
real ``flower-superlink`` and ``flower-supernode``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Self

import pytest

from fedgsp_flwr.tools import federation
from fedgsp_flwr.tools.federation import (
    make_certificates,
    make_node_key,
    stop_on_signals,
    write_private,
)
from fedgsp_flwr.tools.launcher import command_line, descendants, is_running

GROUP_OTHER = 0o077
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT

# Audit events of the process (an audit hook cannot be removed: it records only while
# a test has set _AUDIT to a list).
_AUDIT: list[tuple[str, tuple[Any, ...]]] | None = None
_HOOKED = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _AUDIT is not None and event in ("open", "os.chmod"):
        _AUDIT.append((event, args))


@contextlib.contextmanager
def audited() -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    """Record the ``open`` (builtin ``open`` and ``os.open`` alike) and ``os.chmod``
    audit events of the block."""
    global _AUDIT, _HOOKED
    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED = True
    events: list[tuple[str, tuple[Any, ...]]] = []
    _AUDIT = events
    try:
        yield events
    finally:
        _AUDIT = None


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def test_private_keys_never_have_group_or_other_bits_under_umask_000(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every opening of a key file for writing goes through ``os.open``, and the file's
    mode right after that call, before a byte is written, is owner-only; no chmod
    widens it. (A file made by ``open()`` / ``Path.write_bytes`` starts as 0666 under
    umask 000, whatever a chmod does afterwards.)
    """
    modes_at_creation: dict[str, list[int]] = {}
    real_open = os.open

    def spy_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> int:
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        modes_at_creation.setdefault(os.fspath(path), []).append(
            stat.S_IMODE(os.fstat(fd).st_mode))
        return fd

    monkeypatch.setattr(os, "open", spy_open)
    with umask(0o000), audited() as events:
        certificates = make_certificates(tmp_path / "certs")
        node_key, node_public = make_node_key(tmp_path / "keys" / "node-0")
    monkeypatch.undo()
    for key in (certificates.server_key, node_key):
        opened = [args for event, args in events if event == "open"
                  and os.fspath(args[0]) == str(key) and args[2] & WRITE_FLAGS]
        assert opened, f"{key} was not written"
        made_by_os_open = modes_at_creation.get(str(key), [])
        assert len(made_by_os_open) == len(opened), (
            f"{key} was opened for writing {len(opened)} time(s), {len(made_by_os_open)} "
            "through os.open with its mode: created by open(), it is 0666 under umask 000")
        assert all(mode & GROUP_OTHER == 0 for mode in made_by_os_open), (
            key, [oct(m) for m in made_by_os_open])
        chmods = [args for event, args in events
                  if event == "os.chmod" and os.fspath(args[0]) == str(key)]
        assert all(args[1] & GROUP_OTHER == 0 for args in chmods), chmods
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    for folder in (certificates.server_key.parent, node_key.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # created here: owner only
    # the public halves stay readable (the CLI registers node-0.pub, nodes read ca.crt)
    assert node_public.read_text().startswith("ecdsa-sha2-nistp384 ")
    assert certificates.ca_cert.read_text().startswith("-----BEGIN CERTIFICATE-----")
    assert b"PRIVATE KEY" in certificates.server_key.read_bytes()


def test_a_key_of_an_earlier_run_is_replaced_and_a_planted_link_not_followed(
        tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    old = keys / "node-0"
    old.write_text("old key")
    old.chmod(0o644)
    make_node_key(old)  # the launcher's --home is reused from run to run
    assert stat.S_IMODE(old.stat().st_mode) == 0o600
    assert "OPENSSH PRIVATE KEY" in old.read_text()
    target = tmp_path / "elsewhere"
    target.write_text("untouched")
    link = keys / "node-1"
    link.symlink_to(target)
    write_private(link, b"secret")
    assert target.read_text() == "untouched"
    assert not link.is_symlink() and link.read_bytes() == b"secret"
    assert stat.S_IMODE(link.stat().st_mode) == 0o600


class RecordingFederation:
    """Stands in for LocalFederation in ``main``: records how it was made, starts
    nothing; its SuperLink has already exited, so ``main`` returns at once."""

    made: ClassVar[list[dict[str, Any]]] = []

    class _Exited:
        def poll(self) -> int:
            return 0

    def __init__(self, app_dir: Any, home: Any, *, tls: bool = False,
                 auth: bool = False) -> None:
        self.made.append({"tls": tls, "auth": auth})
        self.address, self.folder, self.home = "127.0.0.1:1", Path(home), Path(home)
        self.superlink = self._Exited()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def add_node(self, node_config: Any, **kwargs: Any) -> None:
        pass

    def wait_for_nodes(self, count: int, timeout: float = 120.0) -> list[int]:
        return []


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    RecordingFederation.made = []
    monkeypatch.setattr(federation, "LocalFederation", RecordingFederation)
    return RecordingFederation.made


def test_tls_and_node_authentication_are_on_by_default(
        recorded: list[dict[str, Any]], tmp_path: Path) -> None:
    federation.main(["--nodes", "1", "--home", str(tmp_path)])
    # kept for compatibility: the defaults
    federation.main(["--nodes", "1", "--home", str(tmp_path), "--tls"])
    federation.main(["--nodes", "1", "--home", str(tmp_path), "--auth"])
    assert recorded == [{"tls": True, "auth": True}] * 3


def test_insecure_gives_the_old_default_with_a_warning(
        recorded: list[dict[str, Any]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    warnings: list[str] = []
    monkeypatch.setattr(federation, "log", lambda level, msg, *a: warnings.append(msg % a))
    federation.main(["--nodes", "1", "--home", str(tmp_path), "--insecure"])
    assert recorded == [{"tls": False, "auth": False}]
    assert len(warnings) == 1 and "--insecure" in warnings[0]
    assert "any user of this machine can join" in warnings[0]


def test_nodes_train_on_one_thread_unless_the_environment_or_caller_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def node_threads(**kwargs: Any) -> str:
        fed = federation.LocalFederation(tmp_path, tmp_path / str(len(list(tmp_path.iterdir()))),
                                         **kwargs)
        return {**fed.env, **fed.node_env}["OMP_NUM_THREADS"]

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert node_threads() == federation.NODE_THREADS == "1"
    assert node_threads(node_env={"OMP_NUM_THREADS": "2"}) == "2"
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert node_threads() == "4"


@pytest.mark.parametrize("flag", ["--tls", "--auth"])
def test_insecure_with_tls_or_auth_is_refused(recorded: list[dict[str, Any]],
                                              tmp_path: Path, flag: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        federation.main(["--home", str(tmp_path), "--insecure", flag])
    assert "--insecure turns TLS and SuperNode authentication off" in capsys.readouterr().err
    assert recorded == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_stop_on_signals_turns_the_first_signal_into_keyboard_interrupt(sig: int) -> None:
    before = {s: signal.getsignal(s) for s in federation.STOP_SIGNALS}
    with pytest.raises(KeyboardInterrupt), stop_on_signals() as received:
        os.kill(os.getpid(), sig)
        time.sleep(5)  # interrupted at once
    assert received == [sig]
    assert {s: signal.getsignal(s) for s in federation.STOP_SIGNALS} == before


def test_signals_while_the_federation_closes_do_not_cut_it_short(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stopped: list[int] = []

    def slow_stop(processes: Any, grace: float = 10.0) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while close() stops processes
        time.sleep(0.2)
        stopped.append(len(processes))

    class NothingStarted(federation.LocalFederation):
        def __init__(self) -> None:  # no SuperLink, no certificates
            self.nodes, self.superlink, self._logs = [], None, []

    monkeypatch.setattr(federation, "_stop_groups", slow_stop)
    fed = NothingStarted()
    fed.superlink = object()  # type: ignore[assignment]
    with stop_on_signals() as received:
        fed.close()
    assert stopped == [0, 1] and fed.superlink is None  # both steps ran to their end
    assert received == [signal.SIGTERM] * 2  # recorded, not raised


# A stand-in for flower-superlink / flower-supernode: a process with a child (as a
# SuperNode's SuperExec), both ending on SIGTERM (Python's default).
TREE = ("import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
        "time.sleep(300)")

# The launcher's main, with LocalFederation's start and the SuperNode process swapped
# for stand-ins (and no key registration); add_node, close, the certificates, keys and
# signal handling are the real ones.
LAUNCHER = f"""
import sys
from fedgsp_flwr.tools import federation as fed

TREE = {TREE!r}

class StandIns(fed.LocalFederation):
    def start(self, timeout=60.0):
        self.superlink = self._spawn([sys.executable, "-c", TREE],
                                     self.folder / "superlink.log")
        return self

    def register(self, public_key):
        pass

    def restart_node(self, node, max_retries=None):
        node.process = self._spawn([sys.executable, "-c", TREE], node.log_path)

    def wait_for_nodes(self, count, timeout=120.0):
        return []

fed.LocalFederation = StandIns
fed.main(sys.argv[1:])
"""
READY = "stops the federation"


def start_launcher(cmd: list[str], cwd: Path, expected: int,
                   timeout: float) -> tuple[subprocess.Popen[bytes], Path, list[int]]:
    """Start the launcher (a session of its own); wait for its ready line and for
    ``expected`` processes under it. Return it, its output file and those processes."""
    out = cwd / "launcher.out"
    launcher = subprocess.Popen(cmd, cwd=cwd, stdout=out.open("wb"),
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    while True:
        tree = descendants(launcher.pid)
        if READY in out.read_text(errors="replace") and len(tree) >= expected:
            return launcher, out, tree
        if launcher.poll() is not None or time.monotonic() > deadline:
            for pid in tree:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            launcher.kill()
            pytest.fail(f"the launcher did not come up: {out.read_text()[-3000:]}")
        time.sleep(0.1)


def stop_and_check(launcher: subprocess.Popen[bytes], out: Path, tree: list[int],
                   sig: int) -> None:
    """Send ``sig`` to the launcher alone; it must exit 0 having stopped ``tree``."""
    try:
        os.kill(launcher.pid, sig)
        code = launcher.wait(timeout=60)
        deadline = time.monotonic() + 5  # the orphans' reaping by init, if any
        while any(map(is_running, tree)) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = {pid: command_line(pid) for pid in tree if is_running(pid)}
        assert not left, f"{signal.Signals(sig).name} left running: {left}"
        assert code == 0, out.read_text()[-3000:]
        assert f"{signal.Signals(sig).name}: every process this federation started is " \
               "stopped" in out.read_text()
    finally:
        for pid in tree:  # only the processes this test started
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_sigterm_and_sighup_stop_every_process_the_launcher_started_as_ctrl_c_does(
        tmp_path: Path, sig: int) -> None:
    launcher, out, tree = start_launcher(
        [sys.executable, "-c", LAUNCHER, "--nodes", "2", "--home", str(tmp_path / "home")],
        tmp_path, expected=6, timeout=60)  # SuperLink, 2 SuperNodes, a child each
    assert len(tree) == 6, [command_line(p) for p in tree]
    stop_and_check(launcher, out, tree, sig)


@pytest.mark.deployment
def test_sigterm_stops_a_real_secure_federation(tmp_path: Path) -> None:
    """``python -m fedgsp_flwr.tools.federation --nodes 1``: TLS and authentication by
    default, and SIGTERM stops the SuperLink, the SuperNode and its SuperExec."""
    launcher, out, tree = start_launcher(
        [sys.executable, "-m", "fedgsp_flwr.tools.federation", "--nodes", "1", "--home",
         str(tmp_path / "home")], tmp_path, expected=2, timeout=180)
    commands = [command_line(pid) for pid in tree]
    superlink = next(c for c in commands if "flower-superlink" in c)
    assert "--enable-supernode-auth" in superlink and "--ssl-keyfile" in superlink
    assert any("--auth-supernode-private-key" in c for c in commands)
    for key in (tmp_path / "home" / "certificates" / "server.key",
                tmp_path / "home" / "keys" / "node-0"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    deadline = time.monotonic() + 15  # the SuperNode's SuperExec, once it is connected
    while not any("superexec" in command_line(p) for p in tree) and (
            time.monotonic() < deadline):
        time.sleep(0.2)
        tree = sorted(set(tree) | set(descendants(launcher.pid)))
    stop_and_check(launcher, out, tree, signal.SIGTERM)
