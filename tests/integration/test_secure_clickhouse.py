"""The store over TLS with a password, against a real ClickHouse server: in with the right URL, refused in one line
without it.

The server is a private one (daemons.PrivateClickHouse) whose packaged config is copied with a secure native port
on a certificate signed by a CA this module makes with `openssl` (daemons.make_pki), and a user `gw` with a
password. With `clickhouses://gw:PASSWORD@HOST:PORT/DB?ca_certs=CA`, `replay --store` writes its rows and
`store query` reads them back; with a wrong password, without the CA (the system's CAs do not know it), or
speaking plain TCP to the TLS port, each command exits 5 with one line on stderr, never the password, no traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from gangwatch.schemas.topics import TopicSettings

from tests.integration.daemons import PrivateClickHouse, make_pki
from tests.integration.kafkakit import REPO, scenario, write_jsonl
from tests.integration.kafkakit import messages as batched

pytestmark = pytest.mark.integration

USER, PASSWORD = "gw", "ch-pass-77c1"
WRONG = "not-the-password-Zq81"
CLI = [sys.executable, "-m", "gangwatch"]


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """(the server, its certificates): TLS on `secure_port`, user `gw`; stopped afterwards."""
    folder = tmp_path_factory.mktemp("ch-tls")
    pki = make_pki(folder / "pki")
    server = PrivateClickHouse(folder, tls=(pki, {USER: PASSWORD}))
    server.start()
    yield server, pki
    server.stop()


def gangwatch(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([*CLI, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_replay_writes_and_store_query_reads_over_tls_with_a_password(secure, tmp_path):
    server, pki = secure
    db = f"s{uuid.uuid4().hex[:10]}"
    url = f"clickhouses://{USER}:{PASSWORD}@127.0.0.1:{server.secure_port}/{db}?ca_certs={pki.ca}"
    src = write_jsonl(tmp_path / "in.jsonl", batched(scenario(xid_node=None), TopicSettings(prefix="gw.")))
    done = gangwatch("replay", str(src), "--out", str(tmp_path / "out"), "--store", url)
    assert done.returncode == 0, done.stderr
    got = gangwatch("store", "query", "SELECT type, nodes FROM gw_actions FINAL WHERE type = 'replace'",
                    "--store", url, "--format", "jsonl")
    assert got.returncode == 0, got.stderr
    assert '"replace"' in got.stdout and '"n001"' in got.stdout
    who = gangwatch("store", "query", "SELECT user AS u FROM system.processes", "--store", url, "--format", "jsonl")
    assert who.returncode == 0 and f'"{USER}"' in who.stdout, who.stderr
    assert PASSWORD not in done.stdout + done.stderr + got.stdout + got.stderr


@pytest.mark.parametrize("case, says", [
    ("password", f"refused user '{USER}'"),
    ("no ca", "certificate verify failed"),
    ("no ca", "give the CA that signed it in the store URL, ?ca_certs=/path/to/ca.pem"),
    ("plain tcp", "does not answer as a native-protocol ClickHouse server"),
])
def test_without_the_right_url_every_command_is_refused_in_one_line(secure, tmp_path, case, says):
    server, pki = secure
    password = WRONG if case == "password" else PASSWORD
    query = "" if case == "no ca" else f"?ca_certs={pki.ca}"
    scheme = "clickhouse" if case == "plain tcp" else "clickhouses"
    url = f"{scheme}://{USER}:{password}@127.0.0.1:{server.secure_port}/default{query}"
    src = tmp_path / "in.jsonl"
    src.write_text('{"kind":"job","v":1,"ts":1.0,"job":"j1","world":1}\n')
    for what, args in {"replay": ("replay", str(src), "--out", str(tmp_path / "out"), "--store", url,
                                  "--connect-timeout", "5"),
                       "store query": ("store", "query", "SELECT 1", "--store", url)}.items():
        done = gangwatch(*args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 5, (what, done.returncode, done.stdout, done.stderr)
        assert len(lines) == 1 and says in lines[0], (what, done.stderr)
        assert WRONG not in done.stdout + done.stderr and PASSWORD not in done.stdout + done.stderr, what
