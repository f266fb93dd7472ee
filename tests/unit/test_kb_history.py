"""The knowledge base read from a fleet history (fleet/kb.py `from_history`, `gangwatch kb search --history`):
"has this node failed like this before" answered from the import format, with no incident in any store.

Expected answers are computed here from the generated events (producers/simulate/precursors.py), not written in.
"""

from __future__ import annotations

import gzip

import orjson
import pytest
from gangwatch.fleet import kb
from gangwatch.fleet.history import parse, to_csv
from gangwatch.producers.simulate.precursors import FleetSpec, generate

from gangwatch import cli
from gangwatch.cli import kb as kb_cli
from gangwatch.cli.options import EXIT_INPUT, EXIT_USAGE

pytestmark = pytest.mark.unit

SPEC = FleetSpec(seed=3, nodes=30, days=200, fault_per_day=0.02)


@pytest.fixture(scope="module")
def events():
    return generate(SPEC)


def _repeat(events) -> tuple[str, str]:
    """A node and class with at least two faults of that class on that node."""
    counts: dict[tuple[str, str], int] = {}
    for e in events:
        if e.end is not None:
            counts[e.node, e.cls] = counts.get((e.node, e.cls), 0) + 1
    return max((c, k) for k, c in counts.items() if k[1] != "fail_stop")[1]


def test_every_fault_is_an_entry_and_the_noise_is_not(events):
    entries = kb.from_history(events)
    faults = [e for e in events if e.end is not None]  # the generator's faults have ends; its noise has none
    assert len(entries) == len(faults) and len({x.id for x in entries}) == len(entries)
    assert {x.cls for x in entries} == {e.cls for e in faults}
    assert all(x.closed and x.recover_s == pytest.approx(e.end - e.start) for x, e in
               zip(entries, sorted(faults, key=lambda e: (e.start, f"{e.node}@{kb.iso(e.start)}/{e.cls}")),
                   strict=True))


def test_has_this_node_failed_like_this_before(events):
    node, cls = _repeat(events)
    want = sorted((e.start for e in events if e.node == node and e.cls == cls and e.end is not None), reverse=True)
    got = kb.search(kb.from_history(events), node=node, cls=cls, limit=100)
    assert len(want) >= 2 and [m.entry.times["onset"] for m in got] == want  # all of them, the latest first
    latest = got[0].entry
    alike = kb.search(kb.from_history(events), like=latest, node=node, limit=100)
    assert [m.entry.times["onset"] for m in alike] == want[1:]  # its class on its node, itself left out
    assert all(m.similarity == 1.0 for m in alike)


def test_an_incidents_evidence_finds_the_historys_faults_of_its_xid():
    text = ("node,start,end,class,description\n"
            "gpu-a017,2026-03-04T11:52:00Z,2026-03-04T19:05:00Z,xid_79,ticket 4411: GPU fell off the bus\n"
            "gpu-a017,2026-03-20T10:00:00Z,2026-03-21T10:00:00Z,xid_48,ticket 4470: double-bit ECC\n"
            "gpu-a017,2026-04-01T09:00:00Z,open,fail_stop,PSU\n"
            "gpu-a017,2026-04-02T09:00:00Z,,thermal,slowdown\n")
    past = kb.from_history(parse(text))
    assert [x.cls for x in past] == ["xid_79", "xid_48", "fail_stop"]  # a precursor without an end is no fault
    assert past[2].resolution == "still out" and not past[2].recover_s and past[0].fix == "back in service"
    incident = kb.Signature.of([("hw_fault", "hardware.xid", "gpu-a017",
                                 {"severity": "fatal", "source": "xid", "code": 79})])
    match = kb.closest(incident, past, 0.1)
    assert match is not None and match.entry.cls == "xid_79" and "ticket 4411" in match.entry.root_cause
    assert incident.similarity(past[1].signature) == 0.0  # another Xid is another failure
    back = kb.Entry.from_dict(orjson.loads(orjson.dumps(past[0].to_dict())))
    assert back == past[0]


def _kb(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["kb", "search", *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_the_command_answers_from_a_gzipped_history_with_no_store(events, tmp_path, monkeypatch, capsys):
    if kb_cli not in cli.COMMANDS:
        monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, kb_cli))
    monkeypatch.chdir(tmp_path)  # a new deployment: no gangwatch-out/store
    monkeypatch.delenv("GANGWATCH_STORE", raising=False)
    path = tmp_path / "tickets.csv.gz"
    path.write_bytes(gzip.compress(to_csv(events).encode()))
    code, _, err = _kb(capsys, "--node", "node0001")
    assert code == EXIT_INPUT and "no store" in err  # without the history there is nothing to ask
    node, cls = _repeat(events)
    code, out, _ = _kb(capsys, "--history", str(path), "--node", node, "--class", cls.upper(), "--format", "json",
                       "--limit", "100")
    got = orjson.loads(out)
    want = sorted((e.start for e in events if e.node == node and e.cls == cls and e.end is not None), reverse=True)
    assert code == 0 and [g["times"]["onset"] for g in got] == want
    assert all(g["root_cause"]["culprit_nodes"] == [node] and g["path"] == "history" for g in got)
    code, out, _ = _kb(capsys, "--history", str(path), "--like", got[0]["id"], "--node", node)
    lines = out.splitlines()
    assert code == 0 and got[0]["id"] in lines[0] and len(lines) == 2 + len(want) - 1 + 1  # header and (N rows)
    code, _, err = _kb(capsys, "--history", str(path), "--like", "node0001@nope")
    assert code == EXIT_USAGE and len(err.strip().splitlines()) == 1 and "NODE@START/CLASS" in err
    bad = tmp_path / "bad.csv"
    bad.write_text("node,start,end,class,description\nn1,17,,xid_79,\n")
    code, _, err = _kb(capsys, "--history", str(bad))
    assert code == EXIT_INPUT and len(err.strip().splitlines()) == 1 and "before 2000" in err
