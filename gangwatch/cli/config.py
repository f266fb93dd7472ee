"""`gangwatch config show`: every effective setting, its value and where it came from."""

from __future__ import annotations

import argparse
import sys

from gangwatch.cli.options import settings_opts


def cmd_config_show(args: argparse.Namespace) -> int:
    import orjson

    rows = args.settings.rows()  # secrets and URL credentials already masked
    if args.json:
        doc = {r.setting: {"value": r.value, "source": r.origin.kind, "from": r.origin.where or None, "env": r.env}
               for r in rows}
        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
        return 0
    width = max(len(r.setting) for r in rows)
    for r in rows:
        value = orjson.dumps(r.value).decode()
        print(f"{r.setting:<{width}}  {value}  ({r.origin})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("config", help="the settings: every one, its value and its source",
                       description="Settings come from flags (and --set NAME=VALUE), then GANGWATCH_* variables "
                       "nested with __ (GANGWATCH_DETECTORS__HANG__MIN_STALL_S for detectors.hang.min_stall_s), "
                       "then a TOML file (--config FILE or GANGWATCH_CONFIG; one table per section, e.g. "
                       "[detectors.hang]), then the defaults.")
    csub = c.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    s = csub.add_parser("show", help="print every effective setting with its source (default, toml, env, flag); "
                        "secrets masked",
                        epilog="example: GANGWATCH_WORKER__BATCH_MAX=5000 gangwatch config show --config gw.toml")
    settings_opts(s)
    s.add_argument("--json", action="store_true",
                   help="one JSON object: setting -> value, source, from (the flag, variable or file), env")
    s.set_defaults(func=cmd_config_show)
