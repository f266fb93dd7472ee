"""The `gangwatch` command line.

One module per group of commands, each with a `register(subparsers)`:
`replay` (replay, store query), `simulate` (simulate, eval, demo), `ingest`
(ingest, schema export), `kafka` (worker, topics, publish), `config` (config
show: the settings object of `gangwatch.settings`). Options that take a value
also read `GANGWATCH_<OPTION>` (see `options.opt`); the help of each says so.
The options of `worker` and `replay` are flags of settings, whose variables are
nested: `GANGWATCH_WORKER__BATCH_MAX`.

A user's mistake is one line on stderr with an exit code of its own (see
`options`), never a traceback; `--debug` (or GANGWATCH_DEBUG=1) shows it.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys

from gangwatch import __version__
from gangwatch.cli import (
    agent,
    config,
    controller,
    drill,
    ingest,
    kafka,
    kb,
    kubernetes,
    replay,
    report,
    rules,
    simulate,
    slurm,
    spares,
    sql,
)
from gangwatch.cli.options import (
    EXIT_EXTRA,
    EXIT_INPUT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_SERVICE,
    UserError,
    boolean,
    resolve,
)

COMMANDS = (replay, simulate, ingest, kafka, agent, controller, slurm, kubernetes, config, sql, report, kb,
            rules, spares, drill)

# The extra that brings each optional top-level module.
EXTRAS = {
    "numpy": "replay", "chdb": "embedded", "clickhouse_driver": "store", "faust": "worker", "aiokafka": "worker",
    "mode": "worker", "prometheus_client": "worker", "sklearn": "stacks", "scipy": "stacks", "pynvml": "nvml",
    "torch": "torch", "pydantic": "replay", "pydantic_settings": "replay", "pydantic_core": "replay",
    "matplotlib": "report",
}


# What kafka-python and aiokafka raise when no broker answers (a service, not a bug: exit 5).
KAFKA_UNREACHABLE = frozenset({"NoBrokersAvailable", "KafkaTimeoutError", "KafkaConnectionError"})


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gangwatch",
        description="Watch large GPU training jobs as a stream: what broke, where, and what to do.",
        epilog="Start with `gangwatch demo`. Exit codes: 2 bad option or environment value, 3 bad path or input, "
        "4 input cut short (what was read is kept), 5 service unreachable, 6 optional dependency missing, "
        "7 `eval`: a class scored below its quality floor, 8 `drill`: a fault missed its budget or an action was "
        "wrong. Docs: README.md and docs/.",
    )
    p.add_argument("--version", action="version", version=f"gangwatch {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks (env GANGWATCH_DEBUG=1)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(sub)
    _mark_parsers(p)
    return p


def _mark_parsers(p: argparse.ArgumentParser) -> None:
    """Each (sub)command's parser as its own default `_parser`: after parsing, `args._parser` is the deepest
    command's (`topics create`, not `topics`), which `_unrecognized` answers with."""
    p.set_defaults(_parser=p)
    for a in p._actions:  # argparse has no public list of a parser's subcommands
        if isinstance(a, argparse._SubParsersAction):
            for sp in a.choices.values():
                _mark_parsers(sp)


def _unrecognized(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """What an argument the command does not take gets: the command's own words, and the option it resembles."""
    options = [s for a in parser._actions for s in a.option_strings]  # argparse has no public list of them
    said = [f"unrecognized arguments: {' '.join(extra)}"]
    for arg in extra:
        if arg.startswith("-"):
            close = difflib.get_close_matches(arg.split("=", 1)[0], options, n=1, cutoff=0.6)
            if close:
                said.append(f"did you mean {close[0]}?")
                break
    return "; ".join(said) + f" ({parser.prog} --help lists them)"


def _debug(args: argparse.Namespace) -> bool:
    if args.debug:
        return True
    try:
        return boolean(os.environ.get("GANGWATCH_DEBUG") or "0")
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flagged = "--debug" in argv  # accepted anywhere on the line, not only before the command
    parser = build_parser()
    args, extra = parser.parse_known_args([a for a in argv if a != "--debug"])
    if extra:  # said by the command's parser (its usage), not the top level's
        args._parser.error(_unrecognized(args._parser, extra))
    args.debug = args.debug or flagged
    debug = _debug(args)
    name = f"gangwatch {args.command}"
    try:
        resolve(args)
        return args.func(args)
    except KeyboardInterrupt:
        print(f"{name}: interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    except UserError as e:
        if debug:
            raise
        print(f"{name}: error: {e}", file=sys.stderr)
        return e.code
    except ModuleNotFoundError as e:
        top = (e.name or "").split(".")[0]
        if debug or top not in EXTRAS:
            raise
        print(f"{name}: error: this needs {top}, which is not installed: "
              f"pip install 'gangwatch[{EXTRAS[top]}]'", file=sys.stderr)
        return EXIT_EXTRA
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
        if debug:
            raise
        print(f"{name}: error: {e.strerror or e}: {e.filename}", file=sys.stderr)
        return EXIT_INPUT
    except ConnectionError as e:
        if debug:
            raise
        print(f"{name}: error: {e}", file=sys.stderr)
        return EXIT_SERVICE
    except Exception as e:
        if debug:
            raise
        if type(e).__name__ in KAFKA_UNREACHABLE:  # past the address check: the broker went away, or is no broker
            print(f"{name}: error: Kafka did not answer in time ({type(e).__name__}: {e}): is the broker still up, "
                  "and do the topics exist (gangwatch topics create)?", file=sys.stderr)
            return EXIT_SERVICE
        print(f"{name}: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback, and "
              "please report it)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
