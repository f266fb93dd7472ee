"""The node agent as a whole: routing and spooling of its records, one pass, a live run, NVML, its command line."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
import types

import pytest
from gangwatch.producers.agent import Agent, AgentSettings
from gangwatch.producers.agent.outbox import Outbox
from gangwatch.producers.nvml import FakeNvml, NvmlUnavailable, RealNvml
from gangwatch.schemas import decode

from gangwatch.cli import build_parser, main
from tests.helpers import data_path

pytestmark = pytest.mark.unit


class FakeKafka:
    """A `send` that keeps what it was given, or raises while `up` is False."""

    def __init__(self) -> None:
        self.up = True
        self.messages: list[tuple[str, bytes, bytes]] = []

    def __call__(self, topic: str, key: bytes, value: bytes) -> None:
        if not self.up:
            raise ConnectionError("no broker")
        self.messages.append((topic, key, value))

    def records(self) -> list[tuple[str, str, object]]:
        """(topic, key, record) of everything sent, in order."""
        return [(t, k.decode(), r) for t, k, v in list(self.messages) for r in decode(v)]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def hw(node: str, code: int) -> dict:
    return {"kind": "hw", "v": 1, "ts": 1.0 + code, "node": node, "source": "xid", "code": code,
            "message": f"NVRM: Xid (PCI:0000:3b:00): {code}, pid=1, name=python, test"}


def stack(job: str, rank: int) -> dict:
    return {"kind": "stack", "v": 1, "ts": 2.0, "job": job, "rank": rank, "snapshot": "a-1", "format": "py-spy",
            "dump": "Thread 1 (idle)"}


def gpu(node: str, index: int) -> dict:
    return {"kind": "gpu", "v": 1, "ts": 3.0, "node": node, "gpu": index, "temp_c": 60.0}


def wait_for(cond, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# --- the outbox -------------------------------------------------------------------------------------


def test_node_events_are_keyed_by_node_and_traces_by_job(tmp_path):
    kafka = FakeKafka()
    box = Outbox(kafka, tmp_path, topic_prefix="p.")
    box.put([hw("n1", 79), stack("j1", 0), gpu("n1", 0), stack("j2", 3), stack("j1", 1)])
    box.flush()
    got = [(t, k, r.kind, getattr(r, "rank", None)) for t, k, r in kafka.records()]
    assert got == [("p.node-events", "n1", "hw", None), ("p.node-events", "n1", "gpu", None),
                   ("p.traces", "j1", "stack", 0), ("p.traces", "j1", "stack", 1), ("p.traces", "j2", "stack", 3)]
    assert all(v.startswith(b'{"kind":"batch"') for _, _, v in kafka.messages)
    assert box.sent == 3 and box.dropped == 0


def test_while_the_broker_is_away_records_spool_and_are_sent_first_in_order_when_it_is_back(tmp_path):
    kafka, timer = FakeKafka(), Clock()
    kafka.up = False
    box = Outbox(kafka, tmp_path, timer=timer)
    for code in (13, 31, 43):
        box.put([hw("n1", code)])
        box.flush()
    assert kafka.messages == [] and box.backlog
    assert list(tmp_path.glob("*/*.spool"))
    kafka.up, timer.t = True, 60.0  # back, after the back-off
    box.put([hw("n1", 79)])
    box.flush()
    assert [r.code for _, _, r in kafka.records()] == [13, 31, 43, 79]
    assert not box.backlog and box.dropped == 0


def test_once_the_broker_is_back_a_backlog_is_sent_in_slices_with_new_records_behind_it(tmp_path):
    """A long outage's backlog does not hold up the sending thread: each cycle sends for `cycle_s`, spools what
    came meanwhile behind the backlog, and the next cycle goes on from there, in order."""
    timer = Clock()

    class Slow(FakeKafka):  # each send takes 0.2 s of the outbox's clock
        def __call__(self, topic: str, key: bytes, value: bytes) -> None:
            super().__call__(topic, key, value)
            timer.t += 0.2

    kafka = Slow()
    kafka.up = False
    box = Outbox(kafka, tmp_path, timer=timer, cycle_s=0.5)
    for code in range(10):
        box.put([hw("n1", code)])
        box.flush()
    kafka.up, timer.t = True, 60.0  # back, after the back-off
    box.put([hw("n1", 99)])
    box.flush()
    assert [r.code for _, _, r in kafka.records()] == [0, 1, 2] and box.backlog  # 0.6 s: the rest waits
    for _ in range(3):
        box.flush()
    assert [r.code for _, _, r in kafka.records()] == [*range(10), 99]
    assert not box.backlog and box.dropped == 0


def test_a_restarted_agent_sends_its_predecessors_backlog(tmp_path):
    down = FakeKafka()
    down.up = False
    first = Outbox(down, tmp_path)
    first.put([hw("n1", 48), stack("j1", 2)])
    first.close()  # no broker: both keys' records stay in the spool
    kafka = FakeKafka()
    second = Outbox(kafka, tmp_path)
    second.flush()  # nothing new: only the backlog
    assert sorted((k, r.kind) for _, k, r in kafka.records()) == [("j1", "stack"), ("n1", "hw")]
    assert not second.backlog


class SlowFirstKafka(FakeKafka):
    """The broker of a loaded machine: its first send waits `first_s` (the client's metadata fetch), then all go."""

    def __init__(self, first_s: float) -> None:
        super().__init__()
        self.first_s = first_s

    def __call__(self, topic: str, key: bytes, value: bytes) -> None:
        if not self.messages:
            time.sleep(self.first_s)
        super().__call__(topic, key, value)


def test_a_backlog_whose_first_send_waits_on_the_broker_is_sent_before_closing_once_each(tmp_path):
    """CI, under load: a `--once` agent's first send of its predecessor's backlog waited past `send_wait_s`, the
    cycle spooled the rest behind it, and the agent closed with everything on the broker and the spool still
    full: the next start would have sent it all again."""
    down = FakeKafka()
    down.up = False
    first = Outbox(down, tmp_path)
    first.put([hw("n1", code) for code in (13, 13, 13, 43)])
    first.close()
    assert first.backlog
    slow = SlowFirstKafka(first_s=0.6)
    second = Outbox(slow, tmp_path, send_wait_s=0.2)
    second.close(timeout_s=10.0)  # as run_once closes it: one last cycle, then as long as sending gets anywhere
    assert [r.code for _, _, r in slow.records()] == [13, 13, 13, 43]  # each once
    assert not second.backlog and not list(tmp_path.glob("*/*.spool"))


def test_an_invalid_record_is_dropped_and_a_full_queue_loses_its_oldest(tmp_path, caplog):
    kafka = FakeKafka()
    box = Outbox(kafka, tmp_path, queue_max=2)
    with caplog.at_level(logging.WARNING, "gangwatch.agent"):
        box.put([{**gpu("n1", 0), "gpu": -1}])
    assert "gpu" in caplog.text and box.dropped == 1
    box.put([hw("n1", 1), hw("n1", 2), hw("n1", 3)])
    box.flush()
    assert [r.code for _, _, r in kafka.records()] == [2, 3] and box.dropped == 2


# --- the agent --------------------------------------------------------------------------------------


def settings(tmp_path, **kw) -> AgentSettings:
    base = {"node": "n9", "bootstrap": "127.0.0.1:1", "topic_prefix": "gw.", "kmsg": str(tmp_path / "kern.log"),
            "gpu_every_s": 5.0, "spool_dir": tmp_path / "spool"}
    return AgentSettings(**{**base, **kw})


def fake_proc(tmp_path, job: str, rank: int, fr_prefix: str):
    root = tmp_path / "proc"
    (root / "321").mkdir(parents=True)
    (root / "321" / "stat").write_text("321 (python) S 1 321 321 0 -1 0\n")
    (root / "321" / "environ").write_bytes(
        f"GANGWATCH_JOB={job}\0RANK={rank}\0TORCH_FR_DUMP_TEMP_FILE={fr_prefix}\0".encode())
    return root


def test_one_pass_samples_the_gpus_reads_the_kernel_log_and_the_flight_dumps(tmp_path):
    shutil.copyfile(data_path("kmsg/xid13-xid43-storm.log"), tmp_path / "kern.log")
    fr = tmp_path / "fr"
    fr.mkdir()
    shutil.copyfile(data_path("flight-recorder/gloo-dataloader-hang-4ranks/rank3.pkl"), fr / "trace_3")
    an_hour_ago = time.time() - 3600
    os.utime(fr / "trace_3", (an_hour_ago, an_hour_ago))
    kafka = FakeKafka()
    gpus = FakeNvml([{"temp_c": 50.0, "throttle": []}, {"temp_c": 91.0, "throttle": ["hw_thermal"]}])
    agent = Agent(settings(tmp_path, flight_dir=fr, from_start=True), send=kafka, nvml=lambda: gpus,
                  proc_root=fake_proc(tmp_path, "j5", 3, str(fr / "trace_")))
    agent.run_once()
    got = kafka.records()
    assert [(r.gpu, r.throttle) for t, k, r in got if r.kind == "gpu"] == [(0, []), (1, ["hw_thermal"])]
    hws = [(t, k, r.code) for t, k, r in got if r.kind == "hw"]
    assert hws == [("gw.node-events", "n9", 13)] * 16 + [("gw.node-events", "n9", 43)]
    assert [(t, k, r.rank) for t, k, r in got if r.kind == "flight"] == [("gw.traces", "j5", 3)]


def test_an_xid_names_the_gpu_nvml_lists_at_its_pci_bus_id(tmp_path):
    """The storm's Xids are on PCI 0000:38:00; NVML lists that bus (in its own spelling) as GPU 2."""
    shutil.copyfile(data_path("kmsg/xid13-xid43-storm.log"), tmp_path / "kern.log")
    kafka = FakeKafka()
    gpus = FakeNvml([{}, {}, {}], bus_ids=["00000000:1A:00.0", "00000000:1B:00.0", "00000000:38:00.0"])
    Agent(settings(tmp_path, from_start=True), send=kafka, nvml=lambda: gpus).run_once()
    assert {(r.code, r.gpu) for _, _, r in kafka.records() if r.kind == "hw"} == {(13, 2), (43, 2)}
    kafka = FakeKafka()
    Agent(settings(tmp_path, from_start=True), send=kafka, nvml=lambda: FakeNvml([{}])).run_once()
    assert {r.gpu for _, _, r in kafka.records() if r.kind == "hw"} == {None}  # a bus NVML does not list


def test_without_nvml_the_agent_says_so_once_and_the_other_collectors_run(tmp_path, caplog):
    shutil.copyfile(data_path("kmsg/h100-xid119.log"), tmp_path / "kern.log")

    def no_driver():
        raise NvmlUnavailable("NVML cannot start here (no NVIDIA driver or GPU?): test")

    kafka = FakeKafka()
    with caplog.at_level(logging.INFO, "gangwatch.agent"):
        Agent(settings(tmp_path, from_start=True), send=kafka, nvml=no_driver).run_once()
    assert caplog.text.count("no GPU samples") == 1
    assert [r.code for _, _, r in kafka.records()] == [119] * 5


def test_a_live_agent_follows_the_log_samples_on_schedule_and_stops_cleanly(tmp_path):
    log = tmp_path / "kern.log"
    shutil.copyfile(data_path("kmsg/benign-kmsg.log"), log)  # before the start: not reported
    kafka = FakeKafka()
    agent = Agent(settings(tmp_path, gpu_every_s=0.05), send=kafka, nvml=lambda: FakeNvml([{"temp_c": 40.0}]))
    agent.listener.connect_timeout_s = 0.1  # no broker in a unit test: the listener just keeps trying
    runner = threading.Thread(target=agent.run, kwargs={"close_timeout_s": 4.0})
    runner.start()
    try:
        with open(log, "a") as f:
            f.write(data_path("kmsg/h100-xid119.log").read_text())
        wait_for(lambda: sum(r.kind == "hw" for _, _, r in kafka.records()) == 5, "the five Xid 119 records")
        wait_for(lambda: sum(r.kind == "gpu" for _, _, r in kafka.records()) >= 3, "GPU samples every 0.05 s")
    finally:
        agent.stop()
        runner.join(10)
    assert not runner.is_alive()
    assert not agent.outbox.backlog


# --- NVML on old and new drivers ---------------------------------------------------------------------


def fake_pynvml(*, new_api: bool, new_driver: bool) -> types.ModuleType:
    """Just enough of nvidia-ml-py for RealNvml: one GPU, throttled by hw_thermal (bit 0x40)."""
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class NVMLError_FunctionNotFound(NVMLError):  # noqa: N801 (nvidia-ml-py's own name)
        pass

    def unsupported(*_):
        raise NVMLError("Not Supported")

    def event_reasons(_):
        if not new_driver:
            raise NVMLError_FunctionNotFound("Function Not Found")
        return 0x40

    nv.NVMLError, nv.NVMLError_FunctionNotFound = NVMLError, NVMLError_FunctionNotFound
    nv.NVML_TEMPERATURE_GPU = nv.NVML_CLOCK_SM = nv.NVML_VOLATILE_ECC = nv.NVML_NVLINK_ERROR_DL_CRC_DATA = 0
    nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    nv.nvmlInit = lambda: None
    nv.nvmlDeviceGetCount = lambda: 1
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetTemperature = lambda h, kind: 88
    for name in ("PowerUsage", "ClockInfo", "UtilizationRates", "TotalEccErrors", "RemappedRows",
                 "PcieReplayCounter", "NvLinkErrorCounter"):
        setattr(nv, f"nvmlDeviceGet{name}", unsupported)
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x40
    if new_api:
        nv.nvmlDeviceGetCurrentClocksEventReasons = event_reasons
    return nv


@pytest.mark.parametrize(("new_api", "new_driver"), [(True, True), (True, False), (False, False)],
                         ids=["new bindings, new driver", "new bindings, old driver", "old bindings"])
def test_throttle_reasons_are_read_on_old_and_new_drivers(monkeypatch, new_api, new_driver):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(new_api=new_api, new_driver=new_driver))
    monkeypatch.setattr(RealNvml, "_initialized", False)
    assert RealNvml().read(0) == {"temp_c": 88.0, "throttle": ["hw_thermal"]}


# --- the command line --------------------------------------------------------------------------------


def test_help_says_what_it_collects_where_it_sends_it_and_which_readers_need_root(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["agent", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for needed in ("node-events keyed by node", "traces keyed by job", "collect_stacks", "py-spy dump",
                   "CAP_SYS_PTRACE", "CAP_SYSLOG", "NVML needs none", "GANGWATCH_NODE", "GANGWATCH_GPU_EVERY",
                   "--spool-dir", "--once"):
        assert needed in text, needed


def test_a_bad_environment_value_is_one_line_and_exit_code_2(monkeypatch, capsys):
    monkeypatch.setenv("GANGWATCH_GPU_EVERY", "-1")
    assert main(["agent", "--once", "--kmsg", "off"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GANGWATCH_GPU_EVERY" in err
