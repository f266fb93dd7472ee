"""Kernel-log parser: real dmesg samples, every line format and event source, folding, never raising."""

from __future__ import annotations

from pathlib import Path

import pytest
from gangwatch.producers.kmsg import KmsgEvent, parse_line, parse_lines, strip_prefix, to_hw_record
from gangwatch.schemas import Hw, decode_obj
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.unit

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


def read_log(real_data: Path, name: str) -> list[str]:
    path = real_data / "kmsg" / name
    if not path.is_file():
        pytest.fail(f"real kernel log {path} missing from the shared test material")
    return path.read_text().splitlines()


def one(line: str) -> KmsgEvent:
    ev = parse_line(line)
    assert ev is not None, line
    return ev


# --- real logs ------------------------------------------------------------------------------


def test_h100_xid119_yields_the_five_xid_lines_and_folds_the_firmware_dump(real_data: Path) -> None:
    lines = read_log(real_data, "h100-xid119.log")
    events = parse_lines(lines)
    # counted by hand: 16:24:18, 16:24:24, 16:24:30, 16:27:12, 16:30:13; the 34 lines of
    # GSP RPC history and call trace after the first one are its dump.
    assert [(e.source, e.code, e.pci) for e in events] == [("xid", 119, "0000:9b:00")] * 5
    assert [(e.pid, e.process) for e in events] == [
        (2024380, "nvidia-smi"),
        (2024380, "nvidia-smi"),
        (2024380, "nvidia-smi"),
        (1263500, "cache_mgr_main"),
        (1240590, "gpud"),
    ]
    assert events[0].message.startswith("NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout")


def test_h100_dump_lines_are_no_events_even_alone(real_data: Path) -> None:
    lines = read_log(real_data, "h100-xid119.log")
    dump = lines[3:37]  # the RPC history (mentions NVLINK_INBAND_RECEIVE) and the call trace
    assert dump[0].endswith("and data 0x0000000000002081 0x0000000000000004.")
    assert dump[-1].endswith("</TASK>")
    assert [parse_line(line) for line in dump] == [None] * len(dump)
    assert parse_lines(dump) == []


def test_storm_yields_sixteen_xid13_then_one_xid43(real_data: Path) -> None:
    events = parse_lines(read_log(real_data, "xid13-xid43-storm.log"))
    assert [e.code for e in events] == [13] * 16 + [43]
    assert {e.source for e in events} == {"xid"} and {e.pci for e in events} == {"0000:38:00"}
    assert all(e.pid is None and e.process is None for e in events[:16])  # pid='<unknown>', name=<unknown>
    assert (events[16].pid, events[16].process) == (2924364, "pt_main_thread")
    assert events[0].message.endswith("Graphics SM Global Exception on (GPC 8, TPC 5, SM 1): Multiple Warp Errors")


def test_benign_kmsg_yields_no_event(real_data: Path) -> None:
    # nvswitch opens, "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready" (an address
    # configuration notice, not a NIC link-state report), wireguard, perf: no event at all.
    lines = read_log(real_data, "benign-kmsg.log")
    assert parse_lines(lines) == []
    assert [parse_line(line) for line in lines] == [None] * len(lines)


# --- line formats --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        f"[Sun Feb 23 16:24:18 2025] {XID79}",
        f"[ 1234.567890] {XID79}",
        f"[12345.678901] {XID79}\n",
        f"[ 1234.567890][  T812] {XID79}",
        f"4,1234,5678901,-;{XID79}",
        f"kern  :warn  : 2025-01-21T04:41:44,283302+00:00 {XID79}",
        f"kern  :err   : [ 1234.567890] {XID79}",
        f"2025-01-21T04:41:44,283302+00:00 {XID79}",
        f"Feb 23 16:24:18 gpu-node-7 kernel: [ 1234.567890] {XID79}",
        f"Feb  3 16:24:18 gpu-node-7 kernel: {XID79}",
        f"<4>[ 1234.567890] {XID79}",  # dmesg -r: the raw priority before the time
        f"<3>{XID79}",
        f"2026-11-30T12:00:01.123456+00:00 gpu-node-7 kernel: {XID79}",  # rsyslog's RFC 3339 time
        XID79,
    ],
)
def test_every_timestamp_format_yields_the_same_event(line: str) -> None:
    ev = one(line)
    assert ev == KmsgEvent(source="xid", code=79, pci="0000:3b:00", pid=1234, process="python", message=XID79)


def test_strip_prefix_keeps_bracketed_messages_that_are_no_timestamp() -> None:
    assert strip_prefix("[drm] Initialized nvidia-drm 0.0.0") == "[drm] Initialized nvidia-drm 0.0.0"
    assert strip_prefix("6,3964,206764307,-;nvidia-nvswitch2: open (major=510)") == "nvidia-nvswitch2: open (major=510)"


# --- Xid -------------------------------------------------------------------------------------


def test_xid_without_pid_and_name() -> None:
    ev = one("[ 1.0] NVRM: Xid (PCI:0000:3B:00): 79, GPU has fallen off the bus.")
    assert (ev.source, ev.code, ev.pci, ev.pid, ev.process) == ("xid", 79, "0000:3b:00", None, None)


def test_xid_with_pid_only_and_ecc_text_stays_an_xid() -> None:
    ev = one(
        "4,99,5,-;NVRM: Xid (PCI:0000:4b:00): 48, pid=77, An uncorrectable double bit error (DBE) has been "
        "detected on GPU in the framebuffer at partition 2, subpartition 0."
    )
    assert (ev.source, ev.code, ev.pid, ev.process) == ("xid", 48, 77, None)


# --- ECC, NVLink --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "hint"),
    [
        ("NVRM: GPU at PCI:0000:3b:00: Double Bit ECC Error (DBE) detected in the framebuffer", "uncorrectable"),
        ("NVRM: GPU at PCI:0000:3b:00: Single bit ECC error corrected", "correctable"),
        ("NVRM: GPU at PCI:0000:3b:00: row remapping pending, reset the GPU to activate", None),
        ("NVRM: GPU at PCI:0000:3b:00: Row remapper: failed to remap row", "uncorrectable"),
    ],
)
def test_nvrm_ecc_lines(line: str, hint: str | None) -> None:
    ev = one(f"[ 5.5] {line}")
    assert (ev.source, ev.code, ev.pci, ev.severity_hint) == ("ecc", None, "0000:3b:00", hint)


def test_nvrm_nvlink_error_and_nvswitch_sxid() -> None:
    ev = one("[ 5.5] NVRM: GPU at PCI:0000:3b:00: NVLink: fatal error detected on link 3")
    assert (ev.source, ev.code, ev.pci) == ("nvlink", None, "0000:3b:00")
    sx = one("nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 20034, Fatal, Link 46 LTSSM Fault Up")
    assert (sx.source, sx.code, sx.pci, sx.severity_hint) == ("nvlink", 20034, "0000:86:00.0", "fatal")
    nf = one("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 41 egress non-posted PRIV error")
    assert (nf.code, nf.severity_hint) == (12028, "nonfatal")


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: GPU at PCI:0000:3b:00: ECC mode enabled",
        "NVRM:      0    4115 NVLINK_INBAND_RECEIVE 0x0000000000000000 0x0000000000000000",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
        "nvidia-nvswitch2: open (major=510)",
    ],
)
def test_informational_nvrm_and_nvswitch_lines_are_no_events(line: str) -> None:
    assert parse_line(line) is None


# --- NIC --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "up", "iface", "pci"),
    [
        ("mlx5_core 0000:17:00.0 ens1np0: Link down", False, "ens1np0", "0000:17:00.0"),
        ("mlx5_core 0000:17:00.0 ens1np0: Link up", True, "ens1np0", "0000:17:00.0"),
        ("e1000e: eth0 NIC Link is Up 1000 Mbps Full Duplex, Flow Control: Rx/Tx", True, "eth0", None),
        ("bnxt_en 0000:41:00.0 ens3f0np0: NIC Link is Down", False, "ens3f0np0", "0000:41:00.0"),
        ("eth0: Link is Down", False, "eth0", None),
        ("ib0: link up", True, "ib0", None),
    ],
)
def test_nic_link_state_changes(line: str, up: bool, iface: str, pci: str | None) -> None:
    ev = one(f"[ 77.000001] {line}")
    assert (ev.source, ev.code, ev.link_up, ev.iface, ev.pci) == ("nic", None, up, iface, pci)


def test_nic_transmit_timeout_is_a_nic_event_without_link_state() -> None:
    ev = one("NETDEV WATCHDOG: ens1np0 (mlx5_core): transmit queue 3 timed out")
    assert (ev.source, ev.link_up, ev.iface, ev.severity_hint) == ("nic", None, "ens1np0", "tx_timeout")


@pytest.mark.parametrize(
    "line",
    [
        "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
        "ata1: SATA link up 6.0 Gbps (SStatus 133 SControl 300)",
        "pcieport 0000:00:03.0: pciehp: Slot(3): Link Up",
        "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
        "docker0: port 1(veth1) entered blocking state",
    ],
)
def test_lines_that_only_look_like_link_changes_are_no_events(line: str) -> None:
    assert parse_line(line) is None


# --- PCIe AER -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "pci", "hint"),
    [
        ("pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0", "0000:01:00.0", "corrected"),
        ("pcieport 0000:00:01.0: AER: Multiple Corrected error received: 0000:01:00.0", "0000:01:00.0", "corrected"),
        (
            "pcieport 0000:80:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:81:00.0",
            "0000:81:00.0",
            "uncorrected_nonfatal",
        ),
        (
            "pcieport 0000:80:01.0: AER: Uncorrected (Fatal) error received: 0000:81:00.0",
            "0000:81:00.0",
            "uncorrected_fatal",
        ),
        (
            "nvidia 0000:81:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
            "0000:81:00.0",
            "corrected",
        ),
    ],
)
def test_aer_headlines(line: str, pci: str, hint: str) -> None:
    ev = one(f"[ 9.9] {line}")
    assert (ev.source, ev.code, ev.pci, ev.severity_hint) == ("pcie", None, pci, hint)


def test_aer_report_is_one_event_and_its_detail_lines_none() -> None:
    report = [
        "[ 9.1] pcieport 0000:80:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:81:00.0",
        "[ 9.1] nvidia 0000:81:00.0: AER: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, "
        "(Requester ID)",
        "[ 9.1] nvidia 0000:81:00.0: AER:   device [10de:2330] error status/mask=00004000/00000000",
        "[ 9.1] nvidia 0000:81:00.0: AER:    [14] CmpltTO                (First)",
    ]
    assert [parse_line(line) is None for line in report[2:]] == [True, True]
    events = parse_lines(report * 2)
    expected = ("pcie", "0000:81:00.0", "uncorrected_nonfatal")
    assert [(e.source, e.pci, e.severity_hint) for e in events] == [expected] * 2


@pytest.mark.parametrize(
    "line",
    [
        "pcieport 0000:00:01.0: AER: enabled with IRQ 122",
        "acpi PNP0A08:00: _OSC: OS now controls [PCIeHotplug SHPCHotplug PME AER PCIeCapability LTR]",
    ],
)
def test_aer_setup_lines_are_no_events(line: str) -> None:
    assert parse_line(line) is None


# --- folding ------------------------------------------------------------------------------------


def test_lines_after_an_xid_fold_into_it_until_an_unrelated_line() -> None:
    nvlink = "[ 2.0] NVRM: GPU at PCI:0000:3b:00: NVLink: fatal error detected on link 3"
    lines = [
        f"[ 1.0] {XID79}",
        "[ 1.0] NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.",
        nvlink,  # same report: folded
        "[ 1.0] CPU: 3 PID: 1234 Comm: python Tainted: P           OE",
        "[ 1.0] Call Trace:",
        "[ 1.0]  dump_stack+0x10/0x16",
        "[ 1.5] NVRM: GPU at PCI:0000:5e:00: Double Bit ECC Error (DBE) detected",  # another GPU: its own event
        "[ 3.0] clocksource: Long readout interval, skipping watchdog check",
        nvlink,  # no open report any more: an event
    ]
    assert parse_line(lines[2]) is not None
    events = parse_lines(lines)
    assert [(e.source, e.pci) for e in events] == [
        ("xid", "0000:3b:00"),
        ("ecc", "0000:5e:00"),
        ("nvlink", "0000:3b:00"),
    ]


def test_each_xid_line_counts_even_inside_a_dump() -> None:
    lines = [f"[ 1.0] {XID79}", "[ 1.0] NVRM: GPU4 RPC history (CPU -> GSP):", f"[ 1.1] {XID79}"]
    assert [e.code for e in parse_lines(lines)] == [79, 79]


# --- hw record -----------------------------------------------------------------------------------


def test_to_hw_record_matches_the_contract() -> None:
    ev = one(f"[ 1.0] {XID79}")
    rec = to_hw_record(ev, node="n003", ts=1_700_000_003, gpu=2)
    assert rec == {
        "kind": "hw",
        "v": 1,
        "ts": 1_700_000_003.0,
        "node": "n003",
        "gpu": 2,
        "source": "xid",
        "code": 79,
        "message": XID79,
        "pci": "0000:3b:00",  # what the parser found travels along as fields the contract keeps
        "pid": 1234,
        "process": "python",
    }
    decoded = decode_obj(rec)
    assert isinstance(decoded, Hw) and (decoded.gpu, decoded.code) == (2, 79)
    assert decoded.extra == {"pci": "0000:3b:00", "pid": 1234, "process": "python"}


def test_to_hw_record_omits_unknown_gpu_and_code() -> None:
    ev = one("eth0: Link is Down")
    rec = to_hw_record(ev, node="n1", ts=5.0)
    assert rec == {"kind": "hw", "v": 1, "ts": 5.0, "node": "n1", "source": "nic", "message": "eth0: Link is Down",
                   "link_up": False, "iface": "eth0"}
    assert isinstance(decode_obj(rec), Hw)


# --- robustness --------------------------------------------------------------------------------

_FRAGMENTS = st.sampled_from(
    ["NVRM: Xid (PCI:", "0000:3b:00", "): ", "79", ", pid=", "name=", "AER: ", "Corrected error received: ",
     "PCIe Bus Error: severity=", "Link is ", "Down", "up", "eth0: ", "mlx5_core ", "[ 1.5] ", "6,1,2,-;",
     "nvidia-nvswitch0: SXid (PCI:", "NVLink error", "ECC", "DBE", "kern  :warn  : ", "NETDEV WATCHDOG: ", ",", " "]
)  # fmt: skip


@given(st.text())
def test_parse_line_never_raises_on_arbitrary_text(text: str) -> None:
    ev = parse_line(text)
    assert ev is None or ev.source in {"xid", "ecc", "nic", "kernel", "pcie", "nvlink", "thermal"}


@given(st.lists(st.one_of(st.text(max_size=40), _FRAGMENTS), max_size=12).map("".join))
def test_parse_line_never_raises_on_near_miss_lines(text: str) -> None:
    ev = parse_line(text)
    assert ev is None or isinstance(ev.message, str)


@given(st.lists(st.text(max_size=80), max_size=20))
def test_parse_lines_never_raises_and_never_exceeds_line_count(lines: list[str]) -> None:
    assert len(parse_lines(lines)) <= len(lines)
