"""Kernel-log parser: turns dmesg / /dev/kmsg lines into hardware events (pure, stdlib only).

It understands the line formats a node sidecar meets:

* ``dmesg -T``            ``[Sun Feb 23 16:24:18 2025] message``
* ``dmesg``               ``[12345.678901] message`` (optionally ``[  T123]`` caller id)
* ``dmesg -x --time-format iso``  ``kern  :warn  : 2025-01-21T04:41:44,283302+00:00 message``
* ``/dev/kmsg``           ``6,1234,5678901,-;message``
* syslog / journal        ``Feb 23 16:24:18 host kernel: message``
* a bare message.

and recognises these events, everything else being ``None``:

* ``xid``    ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, text``
* ``ecc``    other NVRM lines about ECC, DBE/SBE, row remapping, page retirement
* ``nvlink`` NVRM lines about an NVLink error, NVSwitch ``SXid`` lines
* ``pcie``   AER headlines (``AER: Corrected error received``, ``PCIe Bus Error: severity=...``)
* ``nic``    link up / down of a network interface, NETDEV WATCHDOG transmit timeouts

``parse_lines`` folds what follows an event and belongs to it (the NVRM firmware
dump and kernel call trace after an Xid, the per-device detail of an AER report),
so one fault is one event. No timestamp is interpreted: the caller stamps records.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

Source = Literal["xid", "ecc", "nic", "kernel", "pcie", "nvlink", "thermal"]


@dataclass(frozen=True, slots=True, kw_only=True)
class KmsgEvent:
    """One hardware event read from the kernel log.

    ``message`` is the line without its timestamp prefix. ``pci`` is the bus id as
    the line prints it, lower-cased (``0000:9b:00`` for NVRM, ``0000:17:00.0``
    elsewhere). ``severity_hint`` is the line's own word on severity when it has
    one (``corrected``, ``uncorrected_fatal``, ``fatal``, ...). ``link_up`` is set
    only for a real link-state change of a network interface ``iface``.
    """

    source: Source
    message: str
    code: int | None = None
    pci: str | None = None
    pid: int | None = None
    process: str | None = None
    severity_hint: str | None = None
    link_up: bool | None = None
    iface: str | None = None


# --- timestamp prefixes -----------------------------------------------------------

_MONO = r"\[\s*\d+\.\d+\]"
_CTIME = r"\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\]"
_ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[,.]\d+)?(?:[+-]\d\d:?\d\d|Z)?"
_FACILITY = r"(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|local[0-7])"
_LEVEL = r"(?:emerg|alert|crit|err|warn|notice|info|debug)"
_PREFIX = re.compile(
    r"^(?:"
    r"\d+,\d+,\d+,[^;]*;"  # /dev/kmsg record header: priority,seq,usec,flags;
    rf"|(?:[A-Z][a-z]{{2}} [ \d]\d \d\d:\d\d:\d\d|{_ISO}) \S+ kernel: (?:{_MONO} ?)?"  # syslog / journal
    rf"|(?:<\d+>|{_FACILITY} *:{_LEVEL} *: )?(?:(?:{_MONO}|{_CTIME}|{_ISO})(?:\[\s*[TC]\d+\])? ?)?"  # dmesg (-r, -x)
    r")"
)


def strip_prefix(line: str) -> str:
    """Return the message of a kernel-log line: the line without its timestamp prefix."""
    line = line.rstrip("\r\n")
    m = _PREFIX.match(line)
    return line[m.end() :] if m else line


# --- recognisers ---------------------------------------------------------------------

_BDF = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<code>\d+)(?:, ?(?P<rest>.*))?")
_XID_PID = re.compile(r"^pid=(?:'?<unknown>'?|(?P<pid>\d+)), ?")
_XID_NAME = re.compile(r"^name=(?P<name>[^,]*)(?:, ?|$)")
_NVRM_PCI = re.compile(r"PCI:(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)")

_ECC_STRONG = re.compile(
    r"\b(?:DBE|SBE|double[- ]bit|single[- ]bit|row[- ]remap\w*|remapped rows?|page retire\w*|retired pages?)\b",
    re.IGNORECASE,
)
_ECC_WORD = re.compile(r"\bECC\b")
_ECC_UNCORR = re.compile(r"\b(?:DBE|double[- ]bit|uncorrect\w*|fail\w*)\b", re.IGNORECASE)
_ECC_CORR = re.compile(r"\b(?:SBE|single[- ]bit|correct\w*)\b", re.IGNORECASE)
_ERROR_WORD = re.compile(r"\b(?:error|errors|fault|fatal|fail|failed|failure)\b", re.IGNORECASE)

_SXID = re.compile(
    rf"^nvidia-nvswitch\d*: SXid \(PCI:(?P<pci>{_BDF})\): (?P<code>\d+), (?P<sev>Non-fatal|Fatal)", re.IGNORECASE
)

_AER_RECEIVED = re.compile(
    r"AER: (?:Multiple )?(?P<sev>Corrected|Uncorrected(?: \((?:Non-)?Fatal\))?) errors? received"
    rf"(?:: (?P<src>{_BDF}))?",
    re.IGNORECASE,
)
_AER_BUS_ERROR = re.compile(r"PCIe Bus Error: severity=(?P<sev>Corrected|Uncorrected(?: \((?:Non-)?Fatal\))?)", re.I)
_DEVICE = re.compile(rf"^(?P<driver>[\w.-]+) (?P<pci>{_BDF})(?::| )")

_LINK = re.compile(r"\b(?:NIC )?link(?: is| status definitely| state changed to)? (?P<state>up|down)\b", re.I)
_NIC_DRIVERS = (
    "mlx4_en|mlx4_core|mlx5_core|mlx5_ib|igb|igc|ixgbe|i40e|ice|e1000e?|bnxt_en|bnxt_re|tg3|r8169|ena|gve|"
    "virtio_net|cxgb4|qede|be2net|nfp|sfc|irdma|efa|hfi1|ionic|atlantic"
)
_IFACE = r"(?:eth|en|ib|bond|team|hsn|wl|vlan|br)[\w.@-]*"
_NIC_LINE = re.compile(
    rf"^(?:(?:{_NIC_DRIVERS})(?: (?P<pci>{_BDF}))?:? ?(?P<if1>{_IFACE})?:?"  # mlx5_core 0000:17:00.0 ens1np0:
    rf"|(?P<if2>{_IFACE}):)"  # eth0: / ib0: / bond0:
    r"(?=[ :])",
)
_NOT_NIC = re.compile(r"\b(?:SATA|pciehp|Slot\(|usb|PHY)\b", re.IGNORECASE)
_NETDEV_WATCHDOG = re.compile(r"^NETDEV WATCHDOG: (?P<iface>\S+) \((?P<driver>[^)]*)\): transmit queue \d+ timed out")


def _xid(m: re.Match[str], message: str) -> KmsgEvent:
    rest = m.group("rest") or ""
    pid = process = None
    pm = _XID_PID.match(rest)
    if pm:
        pid = int(pm.group("pid")) if pm.group("pid") else None
        rest = rest[pm.end() :]
    nm = _XID_NAME.match(rest)
    if nm:
        name = nm.group("name").strip()
        process = name if name and "<unknown>" not in name else None
    return KmsgEvent(
        source="xid", message=message, code=int(m.group("code")), pci=m.group("pci").lower(), pid=pid, process=process
    )


def _nvrm(message: str) -> KmsgEvent | None:
    """A non-Xid NVRM line: an ECC or NVLink error, or nothing."""
    pm = _NVRM_PCI.search(message)
    pci = pm.group("pci").lower() if pm else None
    if "nvlink" in message.lower() and _ERROR_WORD.search(message):
        return KmsgEvent(source="nvlink", message=message, pci=pci)
    if _ECC_STRONG.search(message) or (_ECC_WORD.search(message) and _ERROR_WORD.search(message)):
        hint = "uncorrectable" if _ECC_UNCORR.search(message) else "correctable" if _ECC_CORR.search(message) else None
        return KmsgEvent(source="ecc", message=message, pci=pci, severity_hint=hint)
    return None


def _aer_severity(text: str) -> str:
    t = text.lower()
    if t.startswith("corrected"):
        return "corrected"
    if "non-fatal" in t:
        return "uncorrected_nonfatal"
    if "fatal" in t:
        return "uncorrected_fatal"
    return "uncorrected"


def _pcie(message: str) -> KmsgEvent | None:
    m = _AER_RECEIVED.search(message) or _AER_BUS_ERROR.search(message)
    if m is None:
        return None
    dev = _DEVICE.match(message)
    src = m.groupdict().get("src")
    pci = src or (dev.group("pci") if dev else None)
    return KmsgEvent(
        source="pcie", message=message, pci=pci.lower() if pci else None, severity_hint=_aer_severity(m.group("sev"))
    )


def _nic(message: str) -> KmsgEvent | None:
    wd = _NETDEV_WATCHDOG.match(message)
    if wd:
        return KmsgEvent(source="nic", message=message, iface=wd.group("iface"), severity_hint="tx_timeout")
    link = _LINK.search(message)
    if link is None or _NOT_NIC.search(message):
        return None
    head = _NIC_LINE.match(message)
    if head is None:
        return None
    iface = head.group("if1") or head.group("if2")
    pci = head.group("pci")
    return KmsgEvent(
        source="nic",
        message=message,
        pci=pci.lower() if pci else None,
        iface=iface,
        link_up=link.group("state").lower() == "up",
    )


def parse_message(message: str) -> KmsgEvent | None:
    """Recognise one kernel message that has no timestamp prefix (see ``strip_prefix``)."""
    if "NVRM:" in message:
        m = _XID.search(message)
        return _xid(m, message) if m else _nvrm(message)
    if message.startswith("nvidia-nvswitch"):
        s = _SXID.match(message)
        if s is None:
            return None
        sev = "fatal" if s.group("sev").lower() == "fatal" else "nonfatal"
        return KmsgEvent(
            source="nvlink", message=message, code=int(s.group("code")), pci=s.group("pci").lower(), severity_hint=sev
        )
    if "AER" in message or "PCIe Bus Error" in message:
        return _pcie(message)
    if "ink" in message or "NETDEV WATCHDOG" in message:
        return _nic(message)
    return None


def parse_line(line: str) -> KmsgEvent | None:
    """Parse one kernel-log line in any supported format; ``None`` when it is no event.

    A single line is judged alone: use ``parse_lines`` on a stream so that the
    dumps following an event are folded into it.
    """
    return parse_message(strip_prefix(line))


# --- folding -----------------------------------------------------------------------------

_TRACE = re.compile(
    r"^(?:\s|CPU: \d+ PID: |Hardware name: |Call Trace:|<TASK>|</TASK>|<IRQ>|</IRQ>|RIP: |RSP: |RAX: |RDX: |RBP: "
    r"|R\d+: |FS: |CS: |CR2: |Code: |Modules linked in:|WARNING: |unwind stack|---\[ end trace|\? )"
)


def _continues(owner: KmsgEvent, message: str, event: KmsgEvent | None) -> bool:
    """Whether ``message`` (parsed as ``event``) belongs to the report ``owner`` opened."""
    if event is not None and event.source == "xid":
        return False  # every Xid line counts
    if owner.source == "xid":
        if message.startswith("NVRM:"):
            pm = _NVRM_PCI.search(message)
            return pm is None or pm.group("pci").lower() == owner.pci
        return bool(_TRACE.match(message))
    if owner.source == "pcie":
        if event is None:
            return bool(message.strip()) and ("AER:" in message or bool(_DEVICE.match(message)))
        return (
            event.source == "pcie"
            and "error received" in owner.message
            and "error received" not in message
            and event.pci == owner.pci
        )
    return False


def parse_lines(lines: Iterable[str]) -> list[KmsgEvent]:
    """Parse a stream of kernel-log lines into events, in order.

    What follows an event and belongs to it makes no event of its own: the NVRM
    firmware dump and call trace after an Xid line (up to the next Xid or an
    unrelated line), and the device detail lines of an AER report.
    """
    events: list[KmsgEvent] = []
    owner: KmsgEvent | None = None
    for line in lines:
        message = strip_prefix(line)
        event = parse_message(message)
        if owner is not None and _continues(owner, message, event):
            continue
        owner = event if event is not None and event.source in ("xid", "pcie") else None
        if event is not None:
            events.append(event)
    return events


def to_hw_record(ev: KmsgEvent, *, node: str, ts: float, gpu: int | None = None) -> dict[str, Any]:
    """Build the contract-v1 ``hw`` record of ``ev`` seen on ``node`` at ``ts`` (epoch seconds).

    ``gpu`` is the GPU index on the node when the caller could map ``ev.pci`` to one;
    the ``gpu`` and ``code`` keys are left out when unknown.
    """
    record: dict[str, Any] = {"kind": "hw", "v": 1, "ts": float(ts), "node": node}
    if gpu is not None:
        record["gpu"] = gpu
    record["source"] = ev.source
    if ev.code is not None:
        record["code"] = ev.code
    record["message"] = ev.message
    # what the parser worked out travels along (unknown fields are kept), so nobody parses the line twice
    for name in ("pci", "pid", "process", "severity_hint", "link_up", "iface"):
        value = getattr(ev, name)
        if value is not None:
            record[name] = value
    return record
