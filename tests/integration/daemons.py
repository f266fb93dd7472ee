"""Real daemons a test starts itself (Alertmanager, munged, slurmctld, slurmd, a ClickHouse server), and the
certificates of a test CA for the ones that speak TLS: find, start, wait, stop.

The convention of conftest.py holds: a program that is not installed skips the
test with the reason (and the package to install), except under
GANGWATCH_REQUIRE_SERVICES=1 (CI), where it fails the run instead of hiding it.
Every wait polls against a deadline; every daemon started is stopped (TERM, then
KILL) even when the test fails.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from tests.helpers import missing

T = TypeVar("T")


def require_program(*names: str, package: str) -> str:
    """The path of the first of `names` found on PATH (or in /usr/sbin); else skip, or fail in CI."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    for name in names:
        found = shutil.which(name, path=search)
        if found:
            return found
    missing(f"{' / '.join(names)} not found; install it with `apt-get install -y {package}`")


_HANDED_OUT: set[int] = set()


# Ports handed out come from below the kernel's ephemeral range (net.ipv4.ip_local_port_range, 32768-60999 by
# default): a port the kernel gave out for `bind(0)` is also what it gives the next outgoing connection, so a
# test's client could take a broker's port between the pick and the broker's bind (seen: "Address already in
# use" while the doc run's clients were busy). Picked at random, so the test processes rarely pick alike.
_PORTS = range(20000, 32000)
_pick = random.Random(os.getpid() ^ time.time_ns())


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, outside the ephemeral range, and not handed out before
    in this process."""
    while True:
        port = _pick.choice(_PORTS)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port


def free_port_range(n: int) -> int:
    """The first of `n` consecutive free ports (for Slurm's Port=[a-b])."""
    for _ in range(50):
        first = free_port()
        if first + n >= 65536:
            continue
        socks = []
        try:
            for p in range(first, first + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports found")


def wait_until(check: Callable[[], T], timeout_s: float, what: str, *, every_s: float = 0.1,
               alive: Daemon | None = None) -> T:
    """Poll `check()` until it returns something truthy; fail with `what` (and a log tail) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last_error = ""
    while True:
        try:
            got = check()
            if got:
                return got
        except Exception as e:  # not up yet: remember why for the failure message
            last_error = f"{type(e).__name__}: {e}"
        if alive is not None and alive.exited():
            pytest.fail(f"{alive.name} exited (code {alive.proc.returncode}) while waiting for {what}\n"
                        f"{alive.tail()}")
        if time.monotonic() > deadline:
            tail = f"\n{alive.tail()}" if alive is not None else ""
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}"
                        f"{' (last error: ' + last_error + ')' if last_error else ''}{tail}")
        time.sleep(every_s)


class Daemon:
    """One process in the foreground of its own session, output to `log`; `stop()` is safe to call twice."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log = log
        self._out = log.open("ab")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True)

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return f"--- last lines of {self.log} ---\n" + "\n".join(text[-lines:])

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(grace_s)
        self._out.close()


@dataclass(frozen=True)
class Pki:
    """A test CA and a server certificate it signed (for 127.0.0.1 and localhost), all PEM; `other_ca` signed
    nothing here (a client that trusts only it must refuse the server)."""

    ca: Path
    cert: Path
    key: Path  # PKCS#8, unencrypted
    other_ca: Path

    @property
    def keystore(self) -> Path:
        """Key and certificate in one file (Kafka's PEM keystore)."""
        out = self.cert.with_name("keystore.pem")
        if not out.exists():
            out.write_text(self.key.read_text() + self.cert.read_text())
        return out


def make_pki(folder: Path) -> Pki:
    """A CA and a server certificate made with the `openssl` program in `folder` (valid for 2 days)."""
    openssl = require_program("openssl", package="openssl")
    folder.mkdir(parents=True, exist_ok=True)

    def run(*argv: str) -> None:
        subprocess.run([openssl, *argv], cwd=folder, check=True, capture_output=True, timeout=60)

    for name in ("ca", "other-ca"):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem",
            "-days", "2", "-subj", f"/CN=gangwatch test {name}")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "san.ext")
    return Pki(ca=folder / "ca.pem", cert=folder / "server.pem", key=folder / "server.key",
               other_ca=folder / "other-ca.pem")


class PrivateClickHouse:
    """A ClickHouse server of one test's own (deploy/clickhouse/server.sh on free ports, its own data dir).

    The shared server of the session must never go down; this one may: `kill()` is SIGKILL (no clean
    shutdown, as a crashed machine), `start()` again serves the same data. `stop()` is safe to repeat.
    """

    SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "clickhouse" / "server.sh"

    def __init__(self, workdir: Path, *, tls: tuple[Pki, dict[str, str]] | None = None) -> None:
        """`tls`: (certificates, users and passwords) for a secure native port, `secure_port`, and those users
        (beside `default`, which has no password and which server.sh's health check uses)."""
        import sys

        require_program("clickhouse-server", "clickhouse", package="clickhouse-server")
        self.dir = workdir / "clickhouse"
        self.port = free_port()
        self.env = {**os.environ, "GANGWATCH_CH_DIR": str(self.dir), "GANGWATCH_CH_PORT": str(self.port),
                    "GANGWATCH_CH_HTTP_PORT": str(free_port()), "GANGWATCH_CH_INTERSERVER_PORT": str(free_port()),
                    "GANGWATCH_CH_TIMEOUT": "60", "PYTHON": sys.executable}
        self.secure_port: int | None = None
        if tls is not None:
            self.secure_port = free_port()
            self.env["GANGWATCH_CH_CONFIG"] = str(self._tls_config(workdir / "clickhouse-config", *tls))

    def _tls_config(self, folder: Path, pki: Pki, users: dict[str, str]) -> Path:
        """The packaged config.xml and users.xml, copied with a secure native port on `pki`'s certificate (no
        Diffie-Hellman file: ECDHE only) and `users` added."""
        import xml.etree.ElementTree as ET

        folder.mkdir(parents=True, exist_ok=True)
        config = ET.parse("/etc/clickhouse-server/config.xml")
        root = config.getroot()
        port = root.find("tcp_port_secure")
        if port is None:
            port = ET.SubElement(root, "tcp_port_secure")
        port.text = str(self.secure_port)
        server = root.find("openSSL/server")
        for name, value in (("certificateFile", pki.cert), ("privateKeyFile", pki.key)):
            server.find(name).text = str(value)
        dh = server.find("dhParamsFile")
        if dh is not None:
            server.remove(dh)
        config.write(folder / "config.xml")
        accounts = ET.parse("/etc/clickhouse-server/users.xml")
        for name, password in users.items():
            user = ET.SubElement(accounts.getroot().find("users"), name)
            ET.SubElement(user, "password").text = password
            ET.SubElement(ET.SubElement(user, "networks"), "ip").text = "::/0"
            ET.SubElement(user, "profile").text = "default"
            ET.SubElement(user, "quota").text = "default"
        accounts.write(folder / "users.xml")
        return folder / "config.xml"

    @property
    def addr(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    def url(self, database: str) -> str:
        return f"clickhouse://127.0.0.1:{self.port}/{database}"

    def _run(self, command: str) -> None:
        done = subprocess.run([str(self.SCRIPT), command], env=self.env, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"server.sh {command} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")

    def start(self) -> None:
        self._run("start")

    def pid(self) -> int:
        return int((self.dir / "server.pid").read_text())

    def kill(self) -> None:
        """SIGKILL, and wait until the process is gone (its port closed)."""
        pid = self.pid()
        os.kill(pid, 9)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
            except OSError:
                return
            if state in ("Z", "X"):  # dead, waiting for a parent that is not us to reap it
                return
            time.sleep(0.05)
        raise RuntimeError(f"ClickHouse (pid {pid}) survived SIGKILL for 10 s")

    def stop(self) -> None:
        self._run("stop")


def metric_samples(port: int) -> list:
    """Every sample (name, labels, value) a local process serves on its Prometheus endpoint at `port`."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def worker_metrics(port: int) -> dict[str, float]:
    """A worker's Prometheus series the fault tests read (its `--metrics-port`), summed over their labels:
    records handed to cores, consumer lag (messages), RSS (bytes)."""
    out = {"records": 0.0, "lag": 0.0, "rss": 0.0}
    for s in metric_samples(port):
        if s.name == "gangwatch_records_total":
            out["records"] += s.value
        elif s.name == "gangwatch_consumer_lag_records":
            out["lag"] += s.value
        elif s.name == "process_resident_memory_bytes":
            out["rss"] = s.value
    return out
