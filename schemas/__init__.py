"""Wire contract v1: typed records, decode/encode, JSON Schema export. No I/O, no logic."""

from gangwatch.schemas.codec import DecodeError, decode, decode_obj, encode, encode_batch, to_dict
from gangwatch.schemas.outputs import DeadLetter, Outputs, ProfileSnapshot
from gangwatch.schemas.records import (
    EVICTING_ACTIONS,
    INPUT_KINDS,
    KINDS,
    OUTPUT_KINDS,
    RESTARTING_ACTIONS,
    Action,
    Finding,
    Flight,
    FlightEntry,
    FlightGroup,
    Frame,
    Framework,
    Gpu,
    Heartbeat,
    Hw,
    Incident,
    Job,
    Lifecycle,
    Ops,
    RankInfo,
    Record,
    Recovery,
    Stack,
    Step,
)

__all__ = [
    "DecodeError", "decode", "decode_obj", "encode", "encode_batch", "to_dict",
    "DeadLetter", "Outputs", "ProfileSnapshot", "EVICTING_ACTIONS", "RESTARTING_ACTIONS",
    "INPUT_KINDS", "KINDS", "OUTPUT_KINDS", "Action", "Finding", "FlightEntry", "FlightGroup", "Flight", "Frame",
    "Framework", "Gpu", "Heartbeat", "Hw", "Incident", "Job", "Lifecycle", "Ops", "RankInfo", "Record", "Recovery",
    "Stack", "Step",
]
