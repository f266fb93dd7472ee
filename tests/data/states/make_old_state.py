"""Save the state of tests/unit/statecases.py's job after its first `SAVED` steps, as the gangwatch on the path
makes it: `python make_old_state.py OUT.json`. Run it against an old version (see README.md) to get a literal
state that version saved; it uses only what every version since state v2 has (`JobCore`, `process`, `state`)."""

import importlib.util
import sys
from pathlib import Path

import orjson
try:
    from gangwatch.triage.core import JobCore
except ImportError:  # before the core moved (commit 4b1b9e1 and older)
    from gangwatch.triage.engine import JobCore

spec = importlib.util.spec_from_file_location("statecases", Path(__file__).parents[2] / "unit" / "statecases.py")
cases = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cases)

core = None
for rec in cases.records(0, cases.SAVED):
    if core is None:
        core = JobCore(rec)
    else:
        core.process(rec)
Path(sys.argv[1]).write_bytes(orjson.dumps(core.state(), option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_SORT_KEYS
                                                  | orjson.OPT_INDENT_2))
