"""`gangwatch ingest` and `gangwatch schema export`: what nodes leave behind, and the contract, as files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gangwatch.cli.options import EXIT_INPUT, EXIT_USAGE, UserError, integer, number, positive


def _pci_gpu(spec: str) -> tuple[str, int]:
    pci, sep, gpu = spec.rpartition("=")
    if not sep or not gpu.isdigit():
        raise UserError(f"--gpu-of wants PCI=GPU (e.g. 0000:3b:00=2), got {spec!r}", EXIT_USAGE)
    return pci, int(gpu)


def cmd_ingest(args: argparse.Namespace) -> int:
    import orjson

    from gangwatch.producers.dumps import (
        flight_records,
        kmsg_folder_records,
        kmsg_records,
        missing_ranks,
        pyspy_records,
    )

    if not args.path.exists():
        raise UserError(f"no such path: {args.path}", EXIT_INPUT)
    if args.format == "kmsg":
        gpu_of = dict(_pci_gpu(x) for x in args.gpu_of or ())
        if args.path.is_dir():  # one log per node, named after it
            logs = {p.stem: p for p in sorted(args.path.iterdir()) if p.is_file() and not p.name.startswith(".")}
            if not logs:
                raise UserError(f"{args.path} holds no kernel logs (one file per node, named after the node)",
                                EXIT_INPUT)
            make = lambda: kmsg_folder_records(logs, ts=args.ts, gpu_of=gpu_of, job=args.job,  # noqa: E731
                                               gpus_per_node=args.gpus_per_node)
        else:
            make = lambda: kmsg_records(args.path, node=args.node, ts=args.ts, gpu_of=gpu_of,  # noqa: E731
                                        job=args.job, gpus_per_node=args.gpus_per_node)
    else:
        if not args.path.is_dir():
            raise UserError(f"{args.path} is not a directory: `ingest {args.format}` reads a folder with one "
                            "dump per rank", EXIT_INPUT)
        reader = pyspy_records if args.format == "pyspy" else flight_records
        make = lambda: reader(args.path, job=args.job or "job", gpus_per_node=args.gpus_per_node,  # noqa: E731
                              ts=args.ts, ranks=args.ranks)
    try:
        recs = make()
    except ValueError as e:
        raise UserError(str(e), EXIT_INPUT) from None
    data = b"".join(orjson.dumps(r) + b"\n" for r in recs)
    if args.out is None:
        sys.stdout.buffer.write(data)
    else:
        args.out.write_bytes(data)
        print(f"wrote {len(recs)} records to {args.out}", file=sys.stderr)
    missing = missing_ranks(recs) if args.format != "kmsg" else []
    if missing:
        shown = ", ".join(map(str, missing[:16])) + (f" and {len(missing) - 16} more" if len(missing) > 16 else "")
        print(f"note: no dump of rank(s) {shown} of {len(recs[0]['ranks'])}: the sweep is analysed without them "
              "(a rank that could not be dumped is often on the node at fault: look at it too)", file=sys.stderr)
    if args.format == "kmsg" and not args.job:
        print("note: no --job given, so the file holds node events only; a replay attributes them to a job "
              "through that job's `job` record (replay it with the job's telemetry, or add --job JOB)",
              file=sys.stderr)
    return 0


def cmd_schema_export(args: argparse.Namespace) -> int:
    from gangwatch.schemas.jsonschema import export

    if args.dir.exists() and not args.dir.is_dir():
        raise UserError(f"{args.dir} is a file; give a directory", EXIT_INPUT)
    paths = export(args.dir)
    print(f"wrote {len(paths)} JSON Schema files to {args.dir}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("ingest", help="turn per-rank dumps or a node's kernel log into replayable records",
                       description="pyspy / flight: read a folder with one file per rank (`*rank<N>*.txt` py-spy "
                       "dumps, text or --json, or `*rank<N>*.pkl` PyTorch flight-recorder pickles, loaded without "
                       "executing code, or their JSON; "
                       "a name ending in the rank, such as PyTorch's own `nccl_trace_rank_3`, will do) "
                       "and write a `job` record and one `stack`/`flight` record per rank, all in one snapshot; "
                       "ranks without a dump are named and the sweep is analysed without them. "
                       "kmsg: read one node's kernel log (dmesg text; or a folder of them, one per node, each "
                       "file named after its node) and write an `hw` record per GPU, ECC, NIC, "
                       "PCIe or NVLink event (multi-line firmware dumps fold into their Xid). Files that are not "
                       "what the format says are refused with the reason.",
                       epilog="examples: gangwatch ingest pyspy tests/data/pyspy/dataloader-hang-8ranks "
                       "--out sweep.jsonl && gangwatch replay sweep.jsonl --out out/ ; "
                       "gangwatch ingest kmsg /var/log/dmesg.txt --node n003 --job j1 --gpu-of 0000:3b:00=2 "
                       "--out hw.jsonl")
    g.add_argument("format", choices=["pyspy", "flight", "kmsg"], help="what PATH holds")
    g.add_argument("path", type=Path, metavar="PATH", help="a folder of per-rank dumps, or a kernel log file")
    g.add_argument("--out", type=Path, help="JSONL file to write (default: stdout)")
    g.add_argument("--job", help="job id (pyspy/flight: default `job`; kmsg: also write a job record on --node)")
    g.add_argument("--gpus-per-node", type=positive(integer), default=1,
                   help="ranks per node when placing ranks on nodes n000, n001, ... (default 1: one node per rank)")
    g.add_argument("--ranks", type=positive(integer),
                   help="pyspy/flight: ranks of the job (default: the highest rank with a dump + 1)")
    g.add_argument("--node", default="n000", help="kmsg: the node a single log comes from (default n000)")
    g.add_argument("--gpu-of", action="append", metavar="PCI=GPU",
                   help="kmsg: map a PCI bus id as the log prints it to a GPU index; repeatable")
    g.add_argument("--ts", type=number, default=1_700_000_000.0,
                   help="event time of the sweep, epoch seconds (fixed by default, so output is reproducible)")
    g.set_defaults(func=cmd_ingest)

    s = sub.add_parser("schema", help="the wire contract: export JSON Schema files")
    ssub = s.add_subparsers(dest="schema_command", metavar="ACTION", required=True)
    e = ssub.add_parser("export", help="write one JSON Schema file per record kind into DIR")
    e.add_argument("dir", type=Path, metavar="DIR")
    e.set_defaults(func=cmd_schema_export)
