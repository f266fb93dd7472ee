"""The `gangwatch` command line.

Each subcommand is a small function over the packages; `gangwatch SUBCOMMAND --help`
explains it. Every option can also come from an environment variable named
GANGWATCH_<OPTION> (e.g. GANGWATCH_STORE), shown in the help.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gangwatch import __version__


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"GANGWATCH_{name.upper()}", default)


# --- replay --------------------------------------------------------------------


def cmd_replay(args: argparse.Namespace) -> int:
    from sinks.store import open_store
    from streams import replay

    missing = [p for p in args.files if not p.exists()]
    if missing:
        print(f"gangwatch replay: no such file: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    out = args.out
    store = None if args.no_store else open_store(args.store or f"chdb:{out / 'store'}")
    try:
        summary = replay.run(args.files, out, store, telemetry=args.telemetry, progress=args.progress)
    finally:
        if store is not None:
            store.close()
    if not args.quiet:
        print(summary.render())
    return 0


# --- schema --------------------------------------------------------------------


def cmd_schema_export(args: argparse.Namespace) -> int:
    from schemas.jsonschema import export

    paths = export(args.dir)
    print(f"wrote {len(paths)} JSON Schema files to {args.dir}")
    return 0


# --- ingest --------------------------------------------------------------------


def cmd_ingest(args: argparse.Namespace) -> int:
    import orjson

    from producers.dumps import flight_records, pyspy_records

    if not args.dir.is_dir():
        print(f"gangwatch ingest: not a directory: {args.dir}", file=sys.stderr)
        return 2
    make = pyspy_records if args.format == "pyspy" else flight_records
    try:
        recs = make(args.dir, job=args.job, gpus_per_node=args.gpus_per_node, ts=args.ts)
    except ValueError as e:
        print(f"gangwatch ingest: {e}", file=sys.stderr)
        return 2
    data = b"".join(orjson.dumps(r) + b"\n" for r in recs)
    if args.out is None:
        sys.stdout.buffer.write(data)
    else:
        args.out.write_bytes(data)
        print(f"wrote {len(recs)} records ({len(recs) - 1} ranks) to {args.out}", file=sys.stderr)
    return 0


# --- parser --------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gangwatch",
        description="Watch large GPU training jobs as a stream: what broke, where, and what to do.",
        epilog="Start with `gangwatch demo`. Docs: README.md; the wire format: `gangwatch schema export DIR`.",
    )
    p.add_argument("--version", action="version", version=f"gangwatch {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    r = sub.add_parser("replay", help="replay JSONL(.gz) telemetry files through the detectors and triage",
                       description="Decode the files (batches unpacked), merge them by event time, run the "
                       "detectors and triage, and write findings/actions/incidents as JSONL plus the embedded "
                       "chDB store. Bad lines go to rejected.jsonl with the reason.")
    r.add_argument("files", nargs="+", type=Path, metavar="FILE", help="JSONL or JSONL.gz files of contract-v1 records")
    r.add_argument("--out", type=Path, default=Path(_env("out", "gangwatch-out")),
                   help="output directory (env GANGWATCH_OUT; default: ./gangwatch-out)")
    r.add_argument("--store", default=_env("store"),
                   help="where rows go: chdb:PATH (embedded, default OUT/store) or clickhouse://HOST:PORT[/DB] "
                   "(env GANGWATCH_STORE)")
    r.add_argument("--no-store", action="store_true", help="write JSONL only")
    r.add_argument("--telemetry", action="store_true", help="also store every raw input record (gw_telemetry)")
    r.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar (default: on when stderr is a terminal)")
    r.add_argument("-q", "--quiet", action="store_true", help="no summary")
    r.set_defaults(func=cmd_replay)

    g = sub.add_parser("ingest", help="turn a folder of per-rank py-spy dumps or flight-recorder pickles into records",
                       description="Read one file per rank (`*rank<N>*.txt` py-spy dumps or `*rank<N>*.pkl` PyTorch "
                       "flight-recorder pickles, loaded without executing code) and write a replayable JSONL: a "
                       "`job` record and one `stack`/`flight` record per rank, all in one snapshot.",
                       epilog="example: gangwatch ingest pyspy ../shared/data/pyspy/dataloader-hang-8ranks "
                       "--out sweep.jsonl && gangwatch replay sweep.jsonl --out out/")
    g.add_argument("format", choices=["pyspy", "flight"], help="what the folder holds")
    g.add_argument("dir", type=Path, metavar="DIR")
    g.add_argument("--out", type=Path, help="JSONL file to write (default: stdout)")
    g.add_argument("--job", default="job", help="job id to use (default: job)")
    g.add_argument("--gpus-per-node", type=int, default=1,
                   help="ranks per node when placing ranks on nodes n000, n001, ... (default 1: one node per rank)")
    g.add_argument("--ts", type=float, default=1_700_000_000.0, help="event time of the sweep (fixed by default)")
    g.set_defaults(func=cmd_ingest)

    s = sub.add_parser("schema", help="the wire contract: export JSON Schema files")
    ssub = s.add_subparsers(dest="schema_command", metavar="ACTION", required=True)
    e = ssub.add_parser("export", help="write one JSON Schema file per record kind into DIR")
    e.add_argument("dir", type=Path, metavar="DIR")
    e.set_defaults(func=cmd_schema_export)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
