"""A command loads what it runs and nothing more: `--help`, `config show` and `sql --list` start without numpy,
Faust, the core or the worker (the settings are plain dataclasses: detectors/config.py, triage/budgets.py,
streams/worker_settings.py); the detectors' settings table is the one the catalog's detectors take."""

from __future__ import annotations

import subprocess
import sys

import pytest
from gangwatch.detectors.config import CONFIGS
from gangwatch.detectors.monitor import detector_configs

pytestmark = pytest.mark.unit

HEAVY = ("numpy", "faust", "aiokafka", "chdb", "sklearn", "matplotlib", "gangwatch.triage.core",
         "gangwatch.detectors.monitor", "gangwatch.streams.worker", "gangwatch.streams.workerio")
PROBE = """
import sys
from gangwatch.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = {heavy!r}
print("LOADED:" + ",".join(sorted(m for m in heavy if m in sys.modules)))
"""


@pytest.mark.parametrize("argv", [["config", "show"], ["sql", "--list"], ["replay", "--help"], ["worker", "--help"],
                                  ["report", "--help"], ["spares", "--help"], ["rules", "suggest", "--help"],
                                  ["eval", "--help"], ["controller", "--help"], ["agent", "--help"], ["--help"]])
def test_a_command_that_runs_nothing_heavy_loads_nothing_heavy(argv):
    p = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), *argv], capture_output=True, text=True,
                       timeout=120)
    [loaded] = [line.removeprefix("LOADED:") for line in p.stdout.splitlines() if line.startswith("LOADED:")]
    assert loaded == "", f"gangwatch {' '.join(argv)} imported {loaded}"


def test_the_probe_sees_a_heavy_import():
    p = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY).replace("main(sys.argv[1:])",
                        "import gangwatch.triage.core"), "--help"], capture_output=True, text=True, timeout=120)
    assert "numpy" in p.stdout and "gangwatch.triage.core" in p.stdout


def test_the_settings_table_of_the_detectors_is_the_catalogs():
    assert CONFIGS == detector_configs() and list(CONFIGS) == list(detector_configs())
