"""Options that also read `GANGWATCH_<NAME>` environment variables, and the errors a user can act on.

    opt(parser, "--batch-max", type=int, default=20000, help="messages per batch")

adds `--batch-max` whose help ends in "(env GANGWATCH_BATCH_MAX; default 20000)".
The variable is read only after parsing, for options the command line left out,
so a bad value never breaks `--help` and becomes one line naming the variable.
An option declared with `env=False` reads no variable and says nothing about one.

An option bound to a setting (`setting="worker.batch_max"`) is a flag of the settings object
(`gangwatch.settings`): its default is the setting's (read from the dataclass that declares it, when help
is shown), its variables are the setting's (`GANGWATCH_WORKER__BATCH_MAX`, and the older flat name where
one exists), and after parsing `resolve` loads every setting (flags > environment > TOML file >
defaults) into `args.settings` and fills the option from it. `settings_opts(p)` adds `--config FILE` and
`--set NAME=VALUE` (any setting) to a command that uses the settings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gangwatch import settings as gw_settings

# Exit codes: one per kind of problem, so scripts can tell them apart.
EXIT_USAGE = 2  # a bad option or environment value (argparse uses 2 too)
EXIT_INPUT = 3  # a path that is missing, of the wrong kind, or not what it claims to be
EXIT_CORRUPT = 4  # an input cut short or corrupt: what was read is kept, the message says where it stopped
EXIT_SERVICE = 5  # Kafka or ClickHouse unreachable within the wait
EXIT_EXTRA = 6  # an optional dependency (an extra) is not installed
EXIT_FLOOR = 7  # `gangwatch eval`: a class scored below its quality floor (what fails CI)
EXIT_DRILL = 8  # `gangwatch drill`: an injection missed its budget, or an action should not have happened
EXIT_INTERNAL = 70  # a bug: rerun with --debug for the traceback
EXIT_INTERRUPTED = 130  # stopped by Ctrl-C (128 + SIGINT, as shells report it)


class UserError(Exception):
    """A mistake the user can fix: printed as one line with its exit code, never as a traceback."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})


def boolean(raw: str) -> bool:
    low = raw.strip().lower()
    if low in TRUE:
        return True
    if low in FALSE:
        return False
    raise ValueError("not a boolean (use 1/0, true/false, yes/no, on/off)")


@dataclass(frozen=True)
class EnvOption:
    dest: str
    flag: str
    env: str
    convert: Callable[[str], Any]
    default: Any
    choices: tuple[str, ...] | None = None
    setting: str = ""  # a path in gangwatch.settings: its value (and `env`'s) comes from the settings object


class _SettingHelp(str):
    """An option's help whose default is looked up only when help is shown (`gangwatch --help` stays fast:
    the setting's dataclass may live in a module that imports numpy or Faust)."""

    setting: str

    def __new__(cls, text: str, setting: str) -> _SettingHelp:
        obj = super().__new__(cls, text)
        obj.setting = setting
        return obj

    def __mod__(self, params: Any) -> str:
        text = str.__str__(self)
        try:
            value = gw_settings.default(self.setting)
        except Exception:  # an extra not installed: say where to look instead of failing --help
            return text.replace("@DEFAULT@", "default: see `gangwatch config show`")
        return text.replace("; @DEFAULT@", "" if value is None or value is False else f"; default {value}")


def env_name(dest: str) -> str:
    return f"GANGWATCH_{dest.upper()}"


def opt(p: argparse.ArgumentParser, *flags: str, type: Callable[[str], Any] = str, default: Any = None,
        env: bool | str = True, help: str = "", setting: str = "", **kw: Any) -> None:
    """`p.add_argument` for an option with a value (or a --x/--no-x switch with `type=bool`); with
    `setting`, a flag of that setting (its default and variables are the setting's)."""
    dest = kw.pop("dest", None) or flags[0].lstrip("-").replace("-", "_")
    name = env if isinstance(env, str) else env_name(dest)
    shown = kw.pop("shown_default", default)
    notes = []
    if setting:
        names = [gw_settings.env_name(setting), *([gw_settings.ALIAS_OF[setting]]
                                                  if setting in gw_settings.ALIAS_OF else [])]
        notes.append(f"env {' or '.join(names)}")
        name = names[-1]  # the variable deployments know it by (`resolve` leaves it to the settings to read)
    elif env:
        notes.append(f"env {name}")
    if shown is not None and shown is not False:
        notes.append(f"default {shown}")
    elif setting:
        notes.append("@DEFAULT@")
    full: str = f"{help} ({'; '.join(notes)})" if notes else help
    if "@DEFAULT@" in full:
        full = _SettingHelp(full, setting)
    if type is bool:
        p.add_argument(*flags, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=full, **kw)
        convert: Callable[[str], Any] = boolean
    else:
        p.add_argument(*flags, dest=dest, type=type, default=None, help=full, **kw)
        convert = type
    specs = p.get_default("_env_options")
    if specs is None:
        specs = []
        p.set_defaults(_env_options=specs)
    specs.append(EnvOption(dest, flags[0], name if env else "", convert, default,
                           tuple(kw["choices"]) if "choices" in kw else None, setting))


def settings_opts(p: argparse.ArgumentParser) -> None:
    """`--config FILE` and `--set NAME=VALUE`: the settings object's file and any one setting as a flag."""
    p.add_argument("--config", metavar="FILE", help=f"TOML file of settings (env {gw_settings.CONFIG_ENV}); "
                   "flags and GANGWATCH_* variables win over it")
    p.add_argument("--set", dest="set_settings", action="append", default=[], metavar="NAME=VALUE",
                   help="set any setting, e.g. --set detectors.hang.min_stall_s=30 (names: `gangwatch config "
                   "show`); repeatable; wins over the environment and the file")
    p.set_defaults(_settings=True)


def resolve(args: argparse.Namespace, environ: dict[str, str] | None = None) -> None:
    """Fill options left out on the command line from their variables, then their defaults."""
    environ = os.environ if environ is None else environ
    specs = getattr(args, "_env_options", None) or ()
    for spec in specs:
        if spec.setting or getattr(args, spec.dest) is not None:
            continue
        raw = environ.get(spec.env) if spec.env else None
        if raw is None or raw == "":
            setattr(args, spec.dest, spec.default)
            continue
        try:
            value = spec.convert(raw)
        except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
            why = str(e) or "not a valid value"
            raise UserError(f"{spec.env}={raw!r}: {why} (it sets {spec.flag}); fix or unset it") from None
        if spec.choices and value not in spec.choices:
            raise UserError(f"{spec.env}={raw!r}: choose one of {', '.join(spec.choices)} (it sets {spec.flag})")
        setattr(args, spec.dest, value)
    bound = [spec for spec in specs if spec.setting]
    if bound or getattr(args, "_settings", False):
        _load_settings(args, bound, environ)


def _load_settings(args: argparse.Namespace, bound: list[EnvOption], environ: Any) -> None:
    """Every setting into `args.settings` (flags > environment > TOML > defaults); bound options filled."""
    flags: dict[str, tuple[Any, str]] = {}
    for spec in bound:
        value = getattr(args, spec.dest)
        if value is not None:
            flags[spec.setting] = (value, spec.flag)
    for raw in getattr(args, "set_settings", None) or ():
        name, eq, value = raw.partition("=")
        if not eq or not name.strip():
            raise UserError(f"--set {raw!r}: want NAME=VALUE, e.g. --set detectors.hang.min_stall_s=30")
        flags[name.strip()] = (None if value.strip().lower() == "none" else value, f"--set {name.strip()}")
    try:
        loaded = gw_settings.load(flags, environ, getattr(args, "config", None))
        loaded.export_kafka(os.environ)
    except gw_settings.SettingsError as e:
        raise UserError(str(e), e.code) from None
    args.settings = loaded
    for spec in bound:
        value = loaded.get(spec.setting)
        origin = loaded.origin(spec.setting)
        if origin.kind != "default" and value is not None:  # the option's own checks (> 0, a port, a URL)
            try:
                checked = spec.convert(str(value).lower() if isinstance(value, bool) else str(value))
            except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
                shown = gw_settings.masked(spec.setting, value)
                raise UserError(f"{spec.setting} (from {origin}): {e or 'not a valid value'}, got {shown!r}") from None
            if spec.choices and checked not in spec.choices:
                raise UserError(f"{spec.setting} (from {origin}): choose one of {', '.join(spec.choices)}, "
                                f"got {value!r}")
        setattr(args, spec.dest, value)


def integer(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError("not an integer") from None


def number(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("not a finite number")
    return value


def positive(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """A converter that also refuses zero and negative numbers."""
    def check(raw: str) -> Any:
        value = convert(raw)
        if value <= 0:
            raise ValueError("must be greater than 0")
        return value
    check.__name__ = f"positive {convert.__name__}"
    return check


def at_least_zero(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    def check(raw: str) -> Any:
        value = convert(raw)
        if value < 0:
            raise ValueError("must not be negative")
        return value
    check.__name__ = convert.__name__
    return check


def port(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """A converter for a TCP port number: 0 to 65535 (0 means off where an option says so)."""
    def check(raw: str) -> Any:
        value = convert(raw)
        if not 0 <= value <= 65535:
            raise ValueError("not a port number (0-65535)")
        return value
    check.__name__ = "port"
    return check


def iso(ts: float | None) -> str:
    """Event time for a person: ISO 8601 UTC to the second (files keep epoch seconds)."""
    if ts is None:
        return "-"
    try:
        return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):  # beyond the years a datetime holds: the number itself
        return repr(ts)


def command_name() -> str:
    """How a hint printed to the user names gangwatch so that it runs as written: `gangwatch` when that is on the
    PATH and is this program, `./gw` when running from a checkout's .venv without it on the PATH (what `./gw demo`
    does), else this program's path."""
    import shutil
    import sys
    from pathlib import Path

    me = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    found = shutil.which("gangwatch")
    if found and (me is None or me.name != "gangwatch" or Path(found).resolve() == me):
        return "gangwatch"
    root = Path(sys.prefix).resolve().parent  # <checkout>/.venv -> <checkout>
    if (root / "gw").is_file():
        try:
            if Path.cwd().resolve() == root:
                return "./gw"
        except OSError:
            pass
        return str(root / "gw")
    return str(me) if me is not None and me.name == "gangwatch" else "gangwatch"
