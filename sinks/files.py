"""JSONL outputs: findings, actions, incidents, the jobs' lives and rejected messages, one file each."""

from __future__ import annotations

from pathlib import Path

from gangwatch.schemas import DeadLetter, Outputs, Record, encode


class JsonlSink:
    """Writes `findings.jsonl`, `actions.jsonl`, `incidents.jsonl`, `jobs.jsonl` (each job's life: one
    `job_state` finding per move), `shadow.jsonl` (shadow mode's would-be actions and their verdicts) and
    `rejected.jsonl` into a directory."""

    def __init__(self, out_dir: Path, *, append: bool = False) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        mode = "ab" if append else "wb"
        self._files = {k: open(out_dir / f"{k}.jsonl", mode) for k in ("findings", "actions", "incidents",
                                                                         "jobs", "shadow", "rejected")}

    def write(self, out: Outputs) -> None:
        for name, recs in (("findings", out.findings), ("actions", out.actions), ("incidents", out.incidents),
                           ("jobs", out.life), ("shadow", out.shadow)):
            fh = self._files[name]
            for rec in recs:
                fh.write(encode(rec) + b"\n")

    def reject(self, dead: DeadLetter) -> None:
        self._files["rejected"].write(dead.encode() + b"\n")

    def observe(self, rec: Record) -> None:
        pass

    def flush(self) -> None:
        for fh in self._files.values():
            fh.flush()

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()
