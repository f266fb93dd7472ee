"""What each test costs, by lane: a table at the end of the run and a JSON file (a pytest plugin, loaded by
tests/conftest.py).

A test's price is its setup, call and teardown together (a session fixture is paid by the first test that
asks for it): the wall seconds, and the CPU seconds of the process that ran it (`getrusage`, itself plus the
children it reaped: a worker subprocess the test started and stopped counts, a service running beside it does
not). Each test belongs to one lane:

| lane | what |
|---|---|
| `integration-live` | the files that run a real torchrun job per test (`tests/conftest.py` `LIVE_JOB_FILES`) |
| `fault` | marked `fault`: the scenario runs through replay and the real services failing under a worker |
| `integration-replay` | the other `integration` tests: real Kafka, ClickHouse, workers, recorded or generated input |
| `contract` | marked `contract` |
| `unit` | the rest (marked `unit`) |

Under pytest-xdist each worker measures its own tests and sends the figures in the teardown report's
`user_properties` (`PROPERTY`); the controller adds them up, prints the table (`lane table`) and writes
everything, one row per test, to `$GANGWATCH_LANE_TABLE` (default: `test-lanes.json` in the run's base
temporary directory). `$GANGWATCH_LANE_BUDGETS` (`LANE=MEASURE:SECONDS,...`, MEASURE one of `cpu`, `wall`,
`span`, as in the table's columns: `cpu` for a lane that computes, whose wall time only says how crowded the
machine was; `wall` for one that waits on the clock; `span` for one that runs in fixed groups, the live lane's
torchrun jobs, whose first start to last end is CI's critical path) adds a budget column, and a line for each
lane over its budget; it never changes the run's result. CI (`.ci/run`) sets both.

The run's own wall time and how busy the machine was meanwhile (every process, from /proc/stat, where there is
one) close the table: the sum of the tests' CPU against cores x wall says whether more workers could help.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

LANES = ("unit", "contract", "integration-replay", "integration-live", "fault")
PROPERTY = "gangwatch_test_price"  # user_properties entry: (PROPERTY, {lane, wall_s, cpu_s, ...})
TABLE_ENV = "GANGWATCH_LANE_TABLE"
BUDGETS_ENV = "GANGWATCH_LANE_BUDGETS"
SLOWEST = 15  # tests listed under the table


def lane_of(item: pytest.Item) -> str:
    from tests.conftest import LIVE_JOB_FILES

    if item.nodeid.startswith(LIVE_JOB_FILES):
        return "integration-live"
    for marker, lane in (("fault", "fault"), ("integration", "integration-replay"), ("contract", "contract")):
        if item.get_closest_marker(marker) is not None:
            return lane
    return "unit"


def _cpu() -> tuple[float, float]:
    """(this process's CPU seconds, its reaped children's), user + system."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def _machine_busy() -> tuple[float, float] | None:
    """(busy, total) jiffies of all CPUs since boot (/proc/stat), or None where there is none."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


# --- in the process that runs the tests (an xdist worker, or pytest itself) --------------------------

_START = pytest.StashKey[tuple[float, float, float, float]]()  # (epoch, perf_counter, own CPU, children's CPU)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[_START] = (time.time(), time.perf_counter(), *_cpu())
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    if call.when == "teardown" and _START in item.stash:
        epoch, t0, own0, kids0 = item.stash[_START]
        own, kids = _cpu()
        item.user_properties.append((PROPERTY, {
            "lane": lane_of(item), "start": round(epoch, 3), "wall_s": round(time.perf_counter() - t0, 3),
            "cpu_s": round(own - own0 + kids - kids0, 3), "children_cpu_s": round(kids - kids0, 3),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        }))
    return (yield)


# --- in the controller: the figures of every test, the table ----------------------------------------

_TESTS: dict[str, dict] = {}  # nodeid -> its price, outcome added
_OUTCOMES: dict[str, str] = {}  # nodeid -> passed / failed / skipped (the worst of its phases)
_SESSION: dict[str, object] = {}


def pytest_sessionstart(session):
    _SESSION.update(start=time.time(), busy=_machine_busy())


def pytest_runtest_logreport(report):
    was = _OUTCOMES.get(report.nodeid, "passed")
    if report.failed or was == "failed":
        _OUTCOMES[report.nodeid] = "failed"
    elif report.skipped or was == "skipped":
        _OUTCOMES[report.nodeid] = "skipped"
    else:
        _OUTCOMES[report.nodeid] = "passed"
    if report.when != "teardown":
        return
    for name, value in getattr(report, "user_properties", ()):
        if name == PROPERTY:
            _TESTS[report.nodeid] = dict(value)


MEASURES = {"cpu": "cpu_s", "wall": "wall_s", "span": "span_s"}


def budgets(text: str | None) -> dict[str, tuple[str, float]]:
    """`LANE=MEASURE:SECONDS,...` -> {lane: (measure, seconds)}; a mistake is an error, said at once."""
    out: dict[str, tuple[str, float]] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        lane, sep, value = part.partition("=")
        measure, colon, seconds = value.partition(":")
        lane, measure = lane.strip(), measure.strip()
        if not sep or not colon or lane not in LANES or measure not in MEASURES:
            raise pytest.UsageError(f"{BUDGETS_ENV}: {part!r} is not LANE=MEASURE:SECONDS with LANE one of "
                                    f"{', '.join(LANES)} and MEASURE one of {', '.join(MEASURES)}")
        try:
            out[lane] = (measure, float(seconds))
        except ValueError:
            raise pytest.UsageError(f"{BUDGETS_ENV}: {part!r}: {seconds!r} is not a number of seconds") from None
    return out


def summary(tests: dict[str, dict], outcomes: dict[str, str], session_wall_s: float,
            machine_busy: float | None, cpus: int, budget: dict[str, tuple[str, float]]) -> dict:
    """The lane table's content (what the JSON file holds, the tests listed one by one)."""
    lanes = {}
    for lane in LANES:
        mine = {n: t for n, t in tests.items() if t["lane"] == lane}
        if not mine:
            continue
        wall = sum(t["wall_s"] for t in mine.values())
        first = min(t["start"] for t in mine.values())
        last = max(t["start"] + t["wall_s"] for t in mine.values())
        lanes[lane] = {
            "tests": len(mine), "failed": sum(outcomes.get(n) == "failed" for n in mine),
            "skipped": sum(outcomes.get(n) == "skipped" for n in mine), "wall_s": round(wall, 1),
            "cpu_s": round(sum(t["cpu_s"] for t in mine.values()), 1), "span_s": round(last - first, 1),
            "workers": len({t["worker"] for t in mine.values()}), "budget_s": budget.get(lane),
        }
    cpu = sum(t["cpu_s"] for t in tests.values())
    return {
        "session": {"wall_s": round(session_wall_s, 1), "cpus": cpus, "tests_cpu_s": round(cpu, 1),
                    "tests_cpu_of_cores": round(cpu / (cpus * session_wall_s), 3) if session_wall_s > 0 else None,
                    "machine_busy": None if machine_busy is None else round(machine_busy, 3),
                    "workers": len({t["worker"] for t in tests.values()})},
        "lanes": lanes,
        "tests": [{"nodeid": n, **t, "outcome": outcomes.get(n, "?")}
                  for n, t in sorted(tests.items(), key=lambda kv: -kv[1]["wall_s"])],
    }


def render(s: dict) -> list[str]:
    """The table's lines."""
    head = f"{'lane':<19} {'tests':>5} {'failed':>6} {'skipped':>7} {'wall s':>8} {'cpu s':>8} {'cpu/wall':>8} " \
           f"{'span s':>7}  budget s"
    lines = [head, "-" * len(head)]
    over = []
    for lane, r in s["lanes"].items():
        ratio = r["cpu_s"] / r["wall_s"] if r["wall_s"] else 0.0
        budget, flag = "-", ""
        if r["budget_s"] is not None:
            measure, seconds = r["budget_s"]
            budget = f"{measure} {seconds:g}"
            if r[MEASURES[measure]] > seconds:
                flag = "  OVER"
                over.append(f"lane {lane} over its budget: {measure} {r[MEASURES[measure]]:.0f} s (its {r['tests']} "
                            f"tests), budget {seconds:g} s (.ci/run's LANE_BUDGETS)")
        lines.append(f"{lane:<19} {r['tests']:>5} {r['failed']:>6} {r['skipped']:>7} {r['wall_s']:>8.1f} "
                     f"{r['cpu_s']:>8.1f} {ratio:>8.2f} {r['span_s']:>7.1f}  {budget}{flag}")
    tests = s["tests"]
    lines.append(f"{'all':<19} {len(tests):>5} {sum(t['outcome'] == 'failed' for t in tests):>6} "
                 f"{sum(t['outcome'] == 'skipped' for t in tests):>7} {sum(t['wall_s'] for t in tests):>8.1f} "
                 f"{sum(t['cpu_s'] for t in tests):>8.1f}")
    sess = s["session"]
    busy = "" if sess["machine_busy"] is None else \
        f"; the machine (every process on it) {100 * sess['machine_busy']:.0f} % busy"
    lines.append(f"run: {sess['wall_s']:.1f} s of wall in {sess['workers']} process(es) on {sess['cpus']} CPUs; the "
                 f"tests' CPU {sess['tests_cpu_s']:.1f} s = {100 * (sess['tests_cpu_of_cores'] or 0):.0f} % of "
                 f"cores x wall{busy}")
    lines.append("(wall s and cpu s: summed over the lane's tests, setup and teardown included, cpu with the children "
                 "each reaped; span s: the lane's first start to its last end)")
    lines += over
    if tests:
        lines.append(f"slowest {min(SLOWEST, len(tests))} (wall s, cpu s, lane, test):")
        lines += [f"  {t['wall_s']:7.1f} {t['cpu_s']:7.1f}  {t['lane']:<18} {t['nodeid']}" for t in tests[:SLOWEST]]
    return lines


def pytest_configure(config):
    budgets(os.environ.get(BUDGETS_ENV))  # a mistake in the budgets fails at once, not after the run


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if os.environ.get("PYTEST_XDIST_WORKER") or not _TESTS:
        return
    wall = time.time() - _SESSION.get("start", time.time())
    busy0, busy1 = _SESSION.get("busy"), _machine_busy()
    machine = (busy1[0] - busy0[0]) / (busy1[1] - busy0[1]) if busy0 and busy1 and busy1[1] > busy0[1] else None
    s = summary(_TESTS, _OUTCOMES, wall, machine, os.cpu_count() or 1, budgets(os.environ.get(BUDGETS_ENV)))
    target = os.environ.get(TABLE_ENV)
    path = Path(target) if target else Path(config._tmp_path_factory.getbasetemp()) / "test-lanes.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(s, indent=1) + "\n")
        where = f"every test's figures written to {path}"
    except OSError as e:
        where = f"not written to {path}: {e}"
    terminalreporter.section("lane table: what each lane of tests cost")
    for line in render(s):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"({where})")


def main(argv: list[str]) -> int:
    """`python -m tests.lanes [FILE]`: the table again, from the JSON a run wrote (default $GANGWATCH_LANE_TABLE)."""
    path = Path(argv[0] if argv else os.environ.get(TABLE_ENV, ""))
    try:
        s = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"no lane table at {path}: {e}")
        return 1
    print("\n".join(render(s)))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
