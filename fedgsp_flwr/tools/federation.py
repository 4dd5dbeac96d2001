"""A real Flower federation on this machine: one SuperLink, SuperNodes, ``flwr run``.

:class:`LocalFederation` starts ``flower-superlink`` (deployment mode, runtime
dependency installation off) and ``flower-supernode`` processes on 127.0.0.1, each
SuperNode with its own port and node config, optionally with TLS (certificates made
by :func:`make_certificates`) and SuperNode authentication (keys made by
:func:`make_node_key`, registered with ``flwr supernode register``). It runs the app
with ``flwr run <app> <connection> --stream`` and stops exactly the processes it
started, each with its process group (a SuperNode's SuperExec and running ClientApp
go with it).

Started as a script, it brings up a federation for a quick try, with TLS and SuperNode
authentication unless ``--insecure`` is given, and keeps it up until Ctrl-C, SIGTERM or
SIGHUP, each of which stops every process it started::

    python -m fedgsp_flwr.tools.federation --nodes 4

Every private key it writes (the server's TLS key, the nodes' authentication keys) is
created readable by its owner only (mode 0600 from the ``open`` call on, whatever the
umask), in a folder only its owner can enter.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import json
import os
import signal
import socket
import subprocess
import time
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from logging import WARNING
from pathlib import Path
from types import FrameType
from typing import Any, Self, TextIO

from flwr.common.logger import log

from ..protocol import NUM_PARTITIONS, PARTITION_ID
from .launcher import FlwrCli, RunOutcome, config_string, free_port

CONNECTION = "fedgsp-local"
HOST = "127.0.0.1"
PRIVATE_MODE = 0o600
"""Mode of every private key file: read and write for its owner only."""
PRIVATE_DIR_MODE = 0o700
# The signals the script stops on, as on Ctrl-C (SIGINT).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# A node's ClientApp threads unless OMP_NUM_THREADS says otherwise: one, as Ray gives a
# simulated node one CPU. Several nodes share this machine, and torch's OpenMP threads
# spin when they outnumber free cores: one epoch of the quickstart CNN on 1,000 examples
# took 23.6 s with two threads and 0.9 s with one beside another run on 2 cores
# (2026-12-02).
NODE_THREADS = "1"
# LocalFederation.close calls under way: stop_on_signals lets them finish.
_closing = 0


def private_folder(folder: Path) -> Path:
    """Create ``folder`` (and its parents) if missing; a folder created here is for its
    owner only (0700). An existing folder keeps its mode.
    """
    if not folder.is_dir():
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
        os.chmod(folder, PRIVATE_DIR_MODE)  # a umask can take the owner's bits, too
    return folder


def write_private(path: str | Path, data: bytes) -> Path:
    """Write a private key file that only its owner can read, from its creation on.

    The file is created by ``os.open(path, O_WRONLY | O_CREAT | O_EXCL, 0o600)``: it
    never exists with group or other permission bits (a umask can only take bits
    away), and no file or link planted at ``path`` is followed. A file already at
    ``path`` (a key of an earlier run in the same folder) is removed first.

    Returns
    -------
    Path
        ``path``.
    """
    path = Path(path)
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                 PRIVATE_MODE)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    return path


@dataclass(frozen=True)
class Certificates:
    """Paths of a CA certificate and of a server certificate and key it signed."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def make_certificates(folder: str | Path, hosts: Sequence[str] = (HOST, "localhost"),
                      days: int = 7) -> Certificates:
    """Write a self-signed CA and a server certificate for ``hosts`` into ``folder``.

    Parameters
    ----------
    folder : str | Path
        Output folder (created).
    hosts : Sequence[str]
        IP addresses or DNS names the server certificate is valid for.
    days : int
        Validity in days.

    Returns
    -------
    Certificates
        PEM files ``ca.crt``, ``server.pem`` and ``server.key``; the key is created
        with mode 0600 (:func:`write_private`) and must stay on the SuperLink's machine.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder = private_folder(Path(folder))
    now = dt.datetime.now(dt.UTC)

    def build(subject: str, issuer: x509.Name, public_key: Any, signer: Any,
              ca: bool) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            names: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedgsp-flwr test CA")])
    ca_cert = build("fedgsp-flwr test CA", ca_name, ca_key.public_key(), ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = build(hosts[0], ca_name, server_key.public_key(), ca_key, ca=False)
    paths = Certificates(folder / "ca.crt", folder / "server.pem", folder / "server.key")
    paths.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    write_private(paths.server_key, server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return paths


def make_node_key(path: str | Path) -> tuple[Path, Path]:
    """Write an ECDSA (SECP384R1) key pair in OpenSSH format: ``path`` and ``path.pub``.

    The format of ``ssh-keygen -t ecdsa -b 384 -N ""``, which SuperNode authentication
    takes.

    Returns
    -------
    tuple[Path, Path]
        The private key file, created with mode 0600 (:func:`write_private`), and the
        public key file.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private = Path(path)
    private_folder(private.parent)
    key = ec.generate_private_key(ec.SECP384R1())
    write_private(private, key.private_bytes(serialization.Encoding.PEM,
                                             serialization.PrivateFormat.OpenSSH,
                                             serialization.NoEncryption()))
    public = private.with_name(private.name + ".pub")
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH))
    return private, public


@dataclass
class NodeProcess:
    """One ``flower-supernode`` started by :class:`LocalFederation`.

    Attributes
    ----------
    name : str
        Its name in logs (``node-<index>``).
    node_config : dict[str, Any]
        Its node config (``partition-id``, ``num-partitions``, ...).
    port : int
        Port of its Runtime API.
    log_path : Path
        Its stdout and stderr.
    key : Path | None
        Its private authentication key, if any.
    process : subprocess.Popen[bytes] | None
        The running process (``None`` once stopped).
    """

    name: str
    node_config: dict[str, Any]
    port: int
    log_path: Path
    key: Path | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        """Whether its process is alive."""
        return self.process is not None and self.process.poll() is None


class LocalFederation(FlwrCli):
    """A SuperLink and SuperNodes on 127.0.0.1, as separate processes, for ``flwr run``.

    Parameters
    ----------
    app_dir : str | Path
        The Flower app (folder with ``pyproject.toml``).
    home : str | Path
        Folder for ``FLWR_HOME``, certificates, keys and process logs.
    tls : bool
        Serve the SuperLink over TLS with certificates made here.
    auth : bool
        Start the SuperLink with ``--enable-supernode-auth`` (needs ``tls``); nodes
        added with ``register=True`` get a key registered with ``flwr supernode
        register``.
    node_env : Mapping[str, str] | None
        Extra environment for the SuperNodes (e.g. ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``).
        ``OMP_NUM_THREADS`` is ``NODE_THREADS`` (1) unless given here or set in the
        environment: the nodes share this machine's cores.

    Examples
    --------
    >>> with LocalFederation(".", "/tmp/fed") as fed:  # doctest: +SKIP
    ...     for i in range(3):
    ...         fed.add_node({"partition-id": i, "num-partitions": 3})
    ...     fed.wait_for_nodes(3)
    ...     outcome = fed.run({"num-server-rounds": 1}, log_path=Path("run.log"))
    """

    def __init__(self, app_dir: str | Path, home: str | Path, *, tls: bool = False,
                 auth: bool = False, node_env: Mapping[str, str] | None = None) -> None:
        if auth and not tls:
            raise ValueError("SuperNode authentication needs TLS: pass tls=True with auth=True")
        super().__init__(app_dir, Path(home) / "flwr-home")
        self.folder = Path(home).resolve()
        self.tls, self.auth = tls, auth
        self.node_env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", NODE_THREADS),
                         **(node_env or {})}
        self.port = free_port()
        self.address = f"{HOST}:{self.port}"
        self.certificates = make_certificates(self.folder / "certificates") if tls else None
        self.nodes: list[NodeProcess] = []
        self.superlink: subprocess.Popen[bytes] | None = None
        self._logs: list[TextIO] = []
        self._write_connection()

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:  # a SuperLink that started and then failed, or Ctrl-C
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write_connection(self) -> None:
        lines = ["[superlink]", f'default = "{CONNECTION}"', "",
                 f"[superlink.{CONNECTION}]", f'address = "{self.address}"']
        if self.certificates is None:
            lines.append("insecure = true")
        else:
            lines.append(f'root-certificates = "{self.certificates.ca_cert}"')
        (self.home / "config.toml").write_text("\n".join(lines) + "\n")

    def _spawn(self, cmd: list[str], log_path: Path,
               env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        log_file = log_path.open("w")
        self._logs.append(log_file)
        # A session of its own: the process group takes the process's children along.
        return subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT,
                                env={**self.env, **(env or {})}, cwd=self.folder,
                                start_new_session=True)

    def _tls_args(self, role: str) -> list[str]:
        certs = self.certificates
        if certs is None:
            return ["--insecure"]
        if role == "superlink":
            return ["--ssl-ca-certfile", str(certs.ca_cert),
                    "--ssl-certfile", str(certs.server_cert),
                    "--ssl-keyfile", str(certs.server_key)]
        return ["--root-certificates", str(certs.ca_cert)]

    def start(self, timeout: float = 60.0) -> LocalFederation:
        """Start the SuperLink and wait until it accepts connections.

        Raises
        ------
        RuntimeError
            If it is already running (``with LocalFederation(...)`` starts it), or it
            exits or does not listen within ``timeout`` seconds.
        """
        if self.superlink is not None and self.superlink.poll() is None:
            raise RuntimeError("the SuperLink is already running: `with LocalFederation("
                               "...) as fed` starts it; do not call fed.start() again")
        cmd = [str(self.bin_dir / "flower-superlink"), *self._tls_args("superlink"),
               "--disable-runtime-dependency-installation", "--host", HOST,
               "--port", str(self.port)]
        if self.auth:
            cmd.append("--enable-supernode-auth")
        log_path = self.folder / "superlink.log"
        self.superlink = self._spawn(cmd, log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.superlink.poll() is not None:
                raise RuntimeError(f"flower-superlink exited: {log_path.read_text()[-2000:]}")
            with socket.socket() as sock:
                if sock.connect_ex((HOST, self.port)) == 0:
                    return self
            time.sleep(0.2)
        raise RuntimeError(f"flower-superlink did not listen on {self.address} in {timeout:g}s")

    def add_node(self, node_config: Mapping[str, Any], *, register: bool = True,
                 max_retries: int | None = None) -> NodeProcess:
        """Start a SuperNode with ``node_config``.

        Parameters
        ----------
        node_config : Mapping[str, Any]
            Its node config.
        register : bool
            With ``auth``: register its public key first (``False`` starts a node the
            SuperLink does not know).
        max_retries : int | None
            Connection attempts before it gives up (``None``: Flower's default, no limit).

        Returns
        -------
        NodeProcess
            The started node.
        """
        index = len(self.nodes)
        node = NodeProcess(f"node-{index}", dict(node_config), free_port(),
                           self.folder / f"node-{index}.log")
        if self.auth:
            node.key, public = make_node_key(self.folder / "keys" / node.name)
            if register:
                self.register(public)
        self.nodes.append(node)
        self.restart_node(node, max_retries=max_retries)
        return node

    def register(self, public_key: Path) -> None:
        """Register a SuperNode's public key with ``flwr supernode register``.

        Raises
        ------
        RuntimeError
            If the CLI reports a failure.
        """
        out = self.cli("supernode", "register", str(public_key), CONNECTION, "--format", "json")
        try:
            ok = bool(json.loads(out).get("success"))
        except json.JSONDecodeError:
            ok = False
        if not ok:
            raise RuntimeError(f"flwr supernode register {public_key} failed: {out[-1000:]}")

    def restart_node(self, node: NodeProcess, max_retries: int | None = None) -> None:
        """(Re)start a node's ``flower-supernode`` process with its node config and key."""
        if node.running:
            raise RuntimeError(f"{node.name} is running")
        cmd = [str(self.bin_dir / "flower-supernode"), *self._tls_args("supernode"),
               "--superlink", self.address, "--port", str(node.port),
               "--node-config", config_string(node.node_config)]
        if node.key is not None:
            cmd += ["--auth-supernode-private-key", str(node.key)]
        if max_retries is not None:
            cmd += ["--max-retries", str(max_retries)]
        node.process = self._spawn(cmd, node.log_path, self.node_env)

    def kill_node(self, node: NodeProcess, sig: int = signal.SIGKILL) -> None:
        """Stop a node's process group at once (SIGKILL: a crash, no goodbye)."""
        if node.process is not None:
            _signal_group(node.process, sig)
            node.process.wait()
            node.process = None

    def online_nodes(self) -> list[int]:
        """Node ids the SuperLink lists as online."""
        out = self.cli("supernode", "list", CONNECTION, "--format", "json")
        try:
            nodes = json.loads(out)["nodes"]
        except (json.JSONDecodeError, KeyError):
            return []
        return [int(n["node-id"]) for n in nodes if n.get("status") == "online"]

    def wait_for_nodes(self, count: int, timeout: float = 120.0) -> list[int]:
        """Block until ``count`` nodes are online; return their ids.

        Raises
        ------
        TimeoutError
            Naming the nodes that did not come up.
        """
        deadline = time.monotonic() + timeout
        while len(online := self.online_nodes()) < count:
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        else:
            return online
        stopped = [n.name for n in self.nodes if not n.running]
        raise TimeoutError(f"{len(online)}/{count} nodes online after {timeout:g}s "
                           f"(exited: {stopped or 'none'})")

    def run(self, run_config: Mapping[str, Any], *, log_path: str | Path,
            timeout: float = 3600.0, app_dir: str | Path | None = None) -> RunOutcome:
        """Run the app on this federation with ``flwr run <app> <connection> --stream``.

        Parameters
        ----------
        run_config : Mapping[str, Any]
            Run-config overrides.
        log_path : str | Path
            File that receives the streamed log.
        timeout : float
            Seconds before the run is stopped and reported as ``timeout``.
        app_dir : str | Path | None
            Another Flower app to run than the federation's (``None``: that one).

        Returns
        -------
        RunOutcome
            Run id, final status, wall time and log path.
        """
        return self.launch([], run_config, log_path=log_path, timeout=timeout,
                           connection=CONNECTION, app_dir=app_dir)

    def pids(self) -> list[int]:
        """PIDs of the running processes this federation started."""
        procs = [self.superlink, *(n.process for n in self.nodes)]
        return [p.pid for p in procs if p is not None and p.poll() is None]

    def close(self) -> None:
        """Stop every process this federation started, each with its process group:
        the SuperNodes together, then the SuperLink (SIGTERM, SIGKILL after 10 s).
        """
        global _closing
        _closing += 1
        try:
            _stop_groups([n.process for n in self.nodes if n.process is not None])
            for node in self.nodes:
                node.process = None
            if self.superlink is not None:
                _stop_groups([self.superlink])
                self.superlink = None
            for log_file in self._logs:
                log_file.close()
            self._logs.clear()
        finally:
            _closing -= 1


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def _stop_groups(processes: Sequence[subprocess.Popen[bytes]], grace: float = 10.0) -> None:
    """SIGTERM process groups, SIGKILL them once their leaders exited or ``grace`` s
    passed (the leaders' children, too), and reap the leaders.
    """
    for process in processes:
        _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for process in processes:
        _signal_group(process, signal.SIGKILL)
        process.wait()


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: stop as on Ctrl-C (a :class:`KeyboardInterrupt`)."""


@contextmanager
def stop_on_signals(signals: Sequence[int] = STOP_SIGNALS) -> Iterator[list[int]]:
    """Within the block, the first of ``signals`` raises :class:`KeyboardInterrupt`
    (SIGINT's own, SIGTERM's and SIGHUP's :class:`Stopped`), so that SIGTERM and SIGHUP
    stop the processes a ``with LocalFederation(...)`` block started exactly as Ctrl-C
    does. Later ones, and any that arrives while :meth:`LocalFederation.close` runs,
    are only recorded: they would cut that cleanup short. The previous handlers come
    back on exit.

    Yields
    ------
    list[int]
        The signals received, in order.
    """
    received: list[int] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        if len(received) > 1 or _closing:
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Stopped(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handle) for sig in signals}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> None:
    """Start a local federation and keep it up until Ctrl-C, SIGTERM or SIGHUP."""
    with stop_on_signals() as received:  # first: a signal during the start-up stops too
        parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        parser.add_argument("--nodes", type=int, default=4, help="SuperNodes to start")
        parser.add_argument("--home", default="local-federation",
                            help="folder for FLWR_HOME, certificates, keys and logs")
        parser.add_argument(
            "--insecure", action="store_true",
            help="no TLS and no SuperNode authentication: any local user can then join "
            "as a node (a warning says so)")
        parser.add_argument("--tls", action="store_true",
                            help="TLS (the default; kept for compatibility)")
        parser.add_argument("--auth", action="store_true",
                            help="SuperNode authentication (the default; kept for "
                            "compatibility)")
        parser.add_argument("--node-config", default="",
                            help="extra node config for every node (TOML values), "
                            "e.g. 'edges=\"0,1\"'")
        args = parser.parse_args(argv)
        if args.nodes < 1:
            parser.error("--nodes must be >= 1")
        if args.insecure and (args.tls or args.auth):
            parser.error("--insecure turns TLS and SuperNode authentication off: drop "
                         "--tls/--auth, or drop --insecure")
        try:
            extra = tomllib.loads("\n".join(args.node_config.split()))
        except tomllib.TOMLDecodeError as err:
            parser.error(f"--node-config: {err}")
        secure = not args.insecure
        if not secure:
            log(WARNING, "--insecure: the SuperLink serves without TLS and accepts any "
                "SuperNode: any user of this machine can join it as a node (and reply "
                "what it likes) and read its traffic. Leave --insecure out for TLS and "
                "SuperNode authentication.")
        try:
            with LocalFederation(".", args.home, tls=secure, auth=secure) as fed:
                for i in range(args.nodes):
                    fed.add_node({PARTITION_ID: i, NUM_PARTITIONS: args.nodes, **extra})
                fed.wait_for_nodes(args.nodes)
                mode = "TLS and SuperNode authentication" if secure else "INSECURE"
                print(f"SuperLink on {fed.address} ({mode}), {args.nodes} SuperNodes "
                      f"online; logs in {fed.folder}. In another shell:\n\n"
                      f"  FLWR_HOME={fed.home} flwr run . {CONNECTION} --stream\n\n"
                      "Ctrl-C (or SIGTERM, SIGHUP) stops the federation.", flush=True)
                while fed.superlink is not None and fed.superlink.poll() is None:
                    time.sleep(1)
                print("flower-superlink exited: stopping the SuperNodes.", flush=True)
        except KeyboardInterrupt:
            pass
        if received:
            print(f"{signal.Signals(received[0]).name}: every process this federation "
                  "started is stopped.", flush=True)


if __name__ == "__main__":
    main()
