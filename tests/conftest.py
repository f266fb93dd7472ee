"""Shared test fixtures: where the real test material lives; GPU tests skip without a GPU.

Also what makes the suite run in parallel processes (pytest-xdist, as CI does: `./gw test -n 4 --dist loadgroup`):
- the live real-job tests (a torchrun job each, CPU-heavy) run in two lanes, one job at a time in each
  (`LANES`); tests sharing a module-scoped job stay in one lane;
- the contract suite's tests of one detector run in one worker (tests/contract/groups.py): its runs over the
  scenarios, and its hash-seed child, are computed once in the session, not in every worker;
- the longest units go first (the lanes, then the fuzz shards, then the fault tests), so the suite's wall
  time is not one long test started last;
- each worker has its own temporary directory (`TMPDIR`): defaults that live under it (a trainer client's
  spool, `<tmp>/gangwatch-spool/<job>/rank<rank>`) are never shared by two tests at once;
- the fault tests' figures travel in the test reports (`user_properties`), so the controller prints the one
  table whichever worker measured them (tests/integration/conftest.py's `fault_figures`).
Without xdist nothing of this changes how a test runs.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tests.contract.groups import group_of as contract_group_of
from tests.helpers import DATA

# What each test costs, by lane (unit, contract, integration-replay, integration-live, fault): a table at the end
# of the run and a JSON file (tests/lanes.py says how it is measured and where it goes).
pytest_plugins = ("tests.lanes",)


@pytest.fixture(scope="session")
def real_data() -> Path:
    """The real test material in `tests/data/` (its README says what each file is and where it comes from)."""
    if not DATA.is_dir():
        pytest.fail(f"real test material not found at {DATA}")
    return DATA


def _gpu_missing() -> str | None:
    """Why no NVIDIA GPU can be used here, or None when NVML finds one."""
    from gangwatch.producers.nvml import NvmlUnavailable, RealNvml

    try:
        nvml = RealNvml()
        if not nvml.count():
            return "NVML sees no GPU"
    except NvmlUnavailable as e:
        return str(e)
    return None


# --- parallel runs (pytest-xdist) ---------------------------------------------------------------

# Files whose tests each run a real torchrun job (4 ranks on CPU, a worker, agents, the controller): at most
# len(LANES) of them at once on a 2-core machine.
LIVE_JOB_FILES = ("tests/integration/test_real_job.py", "tests/integration/test_broker_outage.py",
                  "tests/integration/test_active_diagnosis.py")
LANES = ("live-1", "live-2")
# Tests (by the start of their name) that share one job (a module-scoped fixture): they share a lane; a test
# renamed out of this list still passes, its job is only started a second time.
SHARED_JOB_TESTS = ("test_a_healthy_run_",)
# The fuzzing (10,000 cases per parser, in shards: tests/unit/test_fuzz.py): CPU-bound, started early.
FUZZ_FILE = "tests/unit/test_fuzz.py"
# Long single tests that should start early (they mostly wait on the wall clock).
EARLY_FILES = ("tests/integration/test_faults", "tests/integration/test_parity.py")


def pytest_configure(config):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "run")[:12]
        own = Path(tempfile.gettempdir()) / f"gangwatch-tests-{run}-{worker}"
        own.mkdir(parents=True, exist_ok=True)
        os.environ["TMPDIR"] = str(own)
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again


def lanes_of(nodeids: list[str]) -> dict[str, str]:
    """The lane of each live-job test, in collection order: round robin, the tests of one shared job together."""
    out: dict[str, str] = {}
    shared: dict[str, str] = {}
    turn = 0
    for nodeid in nodeids:
        if not nodeid.startswith(LIVE_JOB_FILES):
            continue
        path, _, name = nodeid.partition("::")
        key = next((f"{path}::{p}" for p in SHARED_JOB_TESTS if name.startswith(p)), None)
        if key is not None and key in shared:
            out[nodeid] = shared[key]
            continue
        out[nodeid] = LANES[turn % len(LANES)]
        turn += 1
        if key is not None:
            shared[key] = out[nodeid]
    return out


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` with the live-job lanes as groups (and `xdist_group` marks as usual).

    The lanes are made here, from the test ids, because pytest-xdist 3.8 under pytest 9 cannot turn marks
    added at collection into groups (it renames `item._nodeid`, which pytest 9 no longer reads)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):
        _lanes: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if "@" in nodeid:  # an xdist_group mark that xdist did turn into a group
                return nodeid.rsplit("@", 1)[-1]
            group = contract_group_of(nodeid)
            if group is not None:
                return group
            if self._lanes is None and self.collection:
                self._lanes = lanes_of(list(self.collection))
            return (self._lanes or {}).get(nodeid, nodeid)

        # Two hangs of pytest-xdist 3.8's scheduler after a worker crashes (a segfault in a C extension),
        # mended here until a release has the fixes: the session must fail with the crashed test, not hang.
        def remove_node(self, node):
            """Put back only what is left of the dead worker's work: 3.8 puts back its finished units too (they
            become empty units nobody completes: the session waits forever at its end, pytest-xdist#1378) and
            the test it crashed on (already reported failed, it would take its replacement down too, #1371)."""
            workload = self.assigned_work.pop(node)
            if not self._pending_of(workload):
                return None
            crashed = next(nid for unit in workload.values() for nid, done in unit.items() if not done)
            for scope, unit in workload.items():
                if crashed in unit:
                    unit[crashed] = True
                if not all(unit.values()):
                    self.workqueue[scope] = unit
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

        def _reschedule(self, node):
            """A worker runs a test only once it holds the next one or was told there is none: a replacement
            given a unit of one test would wait forever (pytest-xdist#1327). Give it another, or the word."""
            super()._reschedule(node)
            if node.shutting_down or self._pending_of(self.assigned_work.get(node, {})) != 1:
                return
            if self.workqueue:
                self._assign_work_unit(node)
            else:
                node.shutdown()

    return LaneScheduling(config, log)


def _order(item) -> int:
    if item.nodeid.startswith(LIVE_JOB_FILES):
        return 0
    if item.nodeid.startswith(FUZZ_FILE):
        return 1
    if item.nodeid.startswith(EARLY_FILES):
        return 2
    return 3


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=_order)  # stable: within a rank, collection order
    gpu_items = [i for i in items if i.get_closest_marker("gpu")]
    if not gpu_items:
        return
    why = _gpu_missing()
    if why:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=f"needs a real NVIDIA GPU: {why}"))


# --- the fault tests' figures: one table at the end of the session -----------------------------

FIGURES_ENV = "GANGWATCH_FAULT_TABLE"
FIGURE_PROPERTY = "gangwatch_fault_figure"  # user_properties entries: (FIGURE_PROPERTY, (fault, figure, value))
_FIGURES: list[tuple[str, str, str]] = []  # (fault, figure, value) in the order the tests reported them
# tests/integration/test_doc_run.py's counts, a document each: (DOC_RUN_PROPERTY, (document, ran, {reason: marked}))
DOC_RUN_PROPERTY = "gangwatch_doc_run"
_DOC_RUNS: list[tuple[str, int, dict[str, int]]] = []


def pytest_runtest_logreport(report):
    if report.when != "call":  # every phase's report carries the properties; count them once
        return
    for name, value in getattr(report, "user_properties", ()):
        if name == FIGURE_PROPERTY:
            _FIGURES.append(tuple(value))
        elif name == DOC_RUN_PROPERTY:
            _DOC_RUNS.append(tuple(value))


def _figures_table() -> str:
    head = ("fault test", "figure", "value")
    widths = [max(len(r[i]) for r in [head, *_FIGURES]) for i in range(3)]
    line = "  ".join("-" * w for w in widths)
    rows = [head, None, *_FIGURES]
    return "\n".join(line if r is None else "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if _DOC_RUNS:
        marked: dict[str, int] = {}
        for _, _, by_reason in _DOC_RUNS:
            for reason, n in by_reason.items():
                marked[reason] = marked.get(reason, 0) + n
        terminalreporter.section("doc commands")
        terminalreporter.write_line(f"{sum(r[1] for r in _DOC_RUNS)} ran as written in {len(_DOC_RUNS)} documents, "
                                    f"{sum(marked.values())} marked not to run:")
        for reason, n in sorted(marked.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"  {n:3d}  {reason}")
    if not _FIGURES:
        return
    table = _figures_table()
    target = os.environ.get(FIGURES_ENV)
    if target:
        path = Path(target)
    else:
        path = Path(config._tmp_path_factory.getbasetemp()) / "fault-figures.txt"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(table + "\n")
        where = f"written to {path}"
    except OSError as e:
        where = f"not written to {path}: {e}"
    terminalreporter.section("fault figures")
    terminalreporter.write_line(table)
    terminalreporter.write_line(f"({where})")
