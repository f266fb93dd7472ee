"""The service scripts under deploy/ (what `./gw up|down|status` runs) say how to run a second stack and what to do
without a Python for their probes: run with --help or with a broken PYTHON, so nothing is started."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import need

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DEFAULTS = {  # every port and folder variable of the two services, with its default
    "GANGWATCH_KAFKA_PORT": "9092", "GANGWATCH_KAFKA_CONTROLLER_PORT": "9093",
    "GANGWATCH_KAFKA_DIR": "/tmp/gangwatch-kafka", "GANGWATCH_CH_PORT": "9000", "GANGWATCH_CH_HTTP_PORT": "8123",
    "GANGWATCH_CH_INTERSERVER_PORT": "9009", "GANGWATCH_CH_DIR": "/tmp/gangwatch-clickhouse",
}


def run(argv: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GANGWATCH_") and k != "PYTHON"}
    # should a script start anything after all, it finds no ClickHouse config
    base["GANGWATCH_CH_CONFIG"] = str(tmp_path / "none.xml")
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**base, **env}, cwd=tmp_path)


def test_up_help_lists_every_port_and_folder_variable_with_its_default_and_starts_nothing(tmp_path):
    out = run([str(DEPLOY / "dev.sh"), "up", "--help"], tmp_path, GANGWATCH_CH_DIR=str(tmp_path / "ch"),
              GANGWATCH_KAFKA_DIR=str(tmp_path / "kafka"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert not (tmp_path / "ch").exists() and not (tmp_path / "kafka").exists()  # nothing was started
    plain = run([str(DEPLOY / "dev.sh"), "--help"], tmp_path)
    for name, default in DEFAULTS.items():
        assert re.search(rf"^  {name} .*\[{re.escape(default)}\]$", plain.stdout, re.M), (name, plain.stdout)
    assert "PYTHON" in plain.stdout
    assert f"[{tmp_path / 'ch'}]" in out.stdout  # a value set is shown as such


def test_the_broker_script_says_in_one_line_what_to_do_without_a_python_with_kafka_python(tmp_path):
    out = run([str(DEPLOY / "kafka" / "broker.sh"), "start"], tmp_path, PYTHON="/bin/false",
              GANGWATCH_KAFKA_DIR=str(tmp_path / "kafka"))
    assert out.returncode == 1
    [line] = out.stderr.strip().splitlines()
    assert "cannot import kafka-python" in line and "./gw up" in line and "set PYTHON" in line


def test_without_python_set_the_scripts_use_the_checkouts_venv(tmp_path):
    venv = str(ROOT / ".venv" / "bin" / "python")
    need(Path(venv).exists(), "no .venv in this checkout")
    for script in (DEPLOY / "kafka" / "broker.sh", DEPLOY / "clickhouse" / "server.sh"):
        out = run([str(script), "--help"], tmp_path)
        assert re.search(rf"^  PYTHON .*\[{re.escape(venv)}\]$", out.stdout, re.M), out.stdout
