"""The wire format of the core's outputs does not move: findings (their evidence included), actions, incidents and
node-profile snapshots of the contract scenarios, through the whole core, encode to the bytes recorded in
`wire_digests.json`.

The digests were recorded before finding evidence became typed (one dataclass per finding type, beside its
detector) and triage started to read it through the detectors' declarations, so a refactoring of either that
changes one byte of output fails here. A change of the outputs that is meant (a detector finds something new)
records new digests, on purpose and in the same commit:

    .venv/bin/python -m tests.contract.test_wire_compat --update
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import orjson
import pytest
from gangwatch.schemas import encode
from gangwatch.triage.core import Core

from tests.contract.harness import SC_IDS, stream

pytestmark = pytest.mark.contract

DIGESTS = Path(__file__).with_name("wire_digests.json")
NL = b"\n"


def _plain(p) -> dict:
    return p if isinstance(p, dict) else p.to_dict()


def outputs_digests(sc_name: str) -> dict[str, str]:
    """sha256 of each output stream of one scenario run through a `Core`, one encoded record per line."""
    core = Core()
    lines: dict[str, list[bytes]] = {"findings": [], "actions": [], "incidents": [], "profiles": []}
    outs = [core.process(rec) for rec in stream(sc_name)]
    outs.append(core.finish())
    for out in outs:
        lines["findings"] += [encode(f) for f in out.findings]
        lines["actions"] += [encode(a) for a in out.actions]
        lines["incidents"] += [encode(i) for i in out.incidents]
        lines["profiles"] += [orjson.dumps(_plain(p)) for p in out.profiles]
    return {k: f"{len(v)}:{hashlib.sha256(NL.join(v)).hexdigest()}" for k, v in lines.items()}


@pytest.mark.parametrize("sc_name", SC_IDS)
def test_outputs_encode_as_recorded(sc_name):
    recorded = orjson.loads(DIGESTS.read_bytes())
    assert sc_name in recorded, f"no digests recorded for {sc_name}: run `python -m {__name__} --update`"
    assert outputs_digests(sc_name) == recorded[sc_name], (
        "the core's outputs no longer encode as recorded; if that is meant, record them again "
        f"(`python -m {__name__} --update`)")


if __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    DIGESTS.write_bytes(orjson.dumps({sc: outputs_digests(sc) for sc in SC_IDS},
                                     option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
    print(f"wrote {DIGESTS}")
