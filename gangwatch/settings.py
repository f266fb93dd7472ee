"""One settings object: every setting of gangwatch, typed, from flags, the environment and a TOML file.

Precedence, highest first:

1. command-line flags (`--batch-max 5000`, or `--set detectors.hang.min_stall_s=30` for any setting);
2. `GANGWATCH_*` environment variables, nested with `__`: `GANGWATCH_WORKER__BATCH_MAX`,
   `GANGWATCH_DETECTORS__HANG__MIN_STALL_S`, `GANGWATCH_TRIAGE__BUDGETS__DETECT`; the older flat names
   of the worker's options (`GANGWATCH_BATCH_MAX`, `GANGWATCH_BOOTSTRAP`, `GANGWATCH_TOPIC_PREFIX`, ...,
   see `ALIASES`) still work, below the nested ones;
3. a TOML file (`--config FILE` or `GANGWATCH_CONFIG`), with one table per section:
   `[worker]`, `[topics]`, `[detectors.hang]`, `[triage.budgets]`, ...; a key nobody knows is an error;
4. the defaults.

The sections are derived from the frozen dataclasses the runtime uses, never restated here: their field
names, types and defaults are read from the dataclasses (`SECTIONS`; `detectors` has one table per
detector of `detectors/catalog.py`, from the config type its constructor takes). So a new field of
`HangConfig` is a setting at once, with its default. What comes out are those dataclasses again:
`Loaded.core_config()` (detectors and triage), `.worker_settings()`, `.topic_settings()`.

pydantic and pydantic-settings are imported by `load()`, never at import time, so the command line's
`--help` stays fast; this module itself imports only the standard library.
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib
import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from gangwatch.schemas.security import ENV as KAFKA_ENV

ENV_PREFIX = "GANGWATCH_"
DELIMITER = "__"
CONFIG_ENV = "GANGWATCH_CONFIG"
MASK = "***"

# The `sinks` section: fields of WorkerSettings that say where outputs go (replay uses them too).
SINK_FIELDS = ("store", "telemetry", "webhook", "webhook_secret", "alertmanager")


@dataclass(frozen=True)
class Section:
    """A section of the settings: the fields of one dataclass (`only` these, or all but `exclude`)."""

    name: str
    ref: str  # "module:Class"
    only: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def dataclass(self) -> type:
        module, _, cls = self.ref.partition(":")
        return getattr(importlib.import_module(module), cls)

    def fields(self) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(self.dataclass())
                if (f.name in self.only if self.only else f.name not in self.exclude)]


SECTIONS = (
    Section("worker", "gangwatch.streams.worker_settings:WorkerSettings",
            exclude=("topics", "core", "lateness_s", *SINK_FIELDS)),
    Section("sinks", "gangwatch.streams.worker_settings:WorkerSettings", only=SINK_FIELDS),
    Section("topics", "gangwatch.schemas.topics:TopicSettings", exclude=("app",)),  # app: the worker's app id
    Section("core", "gangwatch.triage.budgets:CoreConfig", exclude=("triage", "detectors")),
    Section("triage", "gangwatch.triage.budgets:TriageConfig"),
    Section("kafka_security", "gangwatch.schemas.security:KafkaSecurity"),  # SASL / SSL of every Kafka client
    # (not `kafka`: GANGWATCH_KAFKA, the tests' broker address, would be read as that whole section)
)
DETECTORS = "detectors"  # the last section: one table per detector, from detectors.config.CONFIGS

# Older flat variable names (one per option of `gangwatch worker`), still read, below the nested names.
ALIASES = {
    "GANGWATCH_BOOTSTRAP": "worker.bootstrap",
    "GANGWATCH_APP_ID": "worker.app_id",
    "GANGWATCH_BATCH_MAX": "worker.batch_max",
    "GANGWATCH_BATCH_WITHIN": "worker.batch_within_s",
    "GANGWATCH_TICK": "worker.tick_s",
    "GANGWATCH_SILENCE": "worker.silence",
    "GANGWATCH_HOLD": "worker.hold_s",
    "GANGWATCH_TABLE_STORE": "worker.table_store",
    "GANGWATCH_DATADIR": "worker.datadir",
    "GANGWATCH_SESSION_TIMEOUT": "worker.session_timeout_s",
    "GANGWATCH_HEARTBEAT_INTERVAL": "worker.heartbeat_interval_s",
    "GANGWATCH_REQUEST_TIMEOUT": "worker.request_timeout_s",
    "GANGWATCH_COMMIT_INTERVAL": "worker.commit_interval_s",
    "GANGWATCH_STANDBY_REPLICAS": "worker.standby_replicas",
    "GANGWATCH_OFFSET_RESET": "worker.offset_reset",
    "GANGWATCH_FETCH_WAIT": "worker.fetch_wait_ms",
    "GANGWATCH_STATS_EVERY": "worker.stats_every_s",
    "GANGWATCH_METRICS_PORT": "worker.metrics_port",
    "GANGWATCH_WEB_PORT": "worker.web_port",
    "GANGWATCH_STORE": "sinks.store",
    "GANGWATCH_WEBHOOK": "sinks.webhook",
    "GANGWATCH_WEBHOOK_SECRET": "sinks.webhook_secret",
    "GANGWATCH_ALERTMANAGER": "sinks.alertmanager",
    "GANGWATCH_LATENESS": "core.lateness_s",
    "GANGWATCH_TOPIC_PREFIX": "topics.prefix",
    "GANGWATCH_TOPIC_PARTITIONS": "topics.partitions",
    "GANGWATCH_TOPIC_REPLICATION": "topics.replication",
    **{variable: f"kafka_security.{name}" for name, variable in KAFKA_ENV.items()},
}
ALIAS_OF = {path: name for name, path in ALIASES.items()}


class SettingsError(ValueError):
    """A bad setting: one line naming it, where it came from and what is expected; `code` as the CLI's."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def env_name(path: str) -> str:
    """`detectors.hang.min_stall_s` -> `GANGWATCH_DETECTORS__HANG__MIN_STALL_S`."""
    return ENV_PREFIX + DELIMITER.join(path.split(".")).upper()


def is_secret(path: str) -> bool:
    name = path.rsplit(".", 1)[-1].lower()
    return any(w in name for w in ("secret", "password", "token"))


def masked(path: str, value: Any) -> Any:
    """The value as shown to a person: secrets as ***, a URL's credentials as ***."""
    if value is None:
        return None
    if is_secret(path):
        return MASK
    if isinstance(value, str) and "@" in value and "://" in value:
        parts = urlsplit(value)
        if parts.netloc and "@" in parts.netloc:
            return urlunsplit(parts._replace(netloc=MASK + "@" + parts.netloc.rsplit("@", 1)[1]))
    return value


# --- defaults without pydantic (for --help) -------------------------------------------------------------


def _hints(dc: type) -> dict[str, Any]:
    return typing.get_type_hints(dc)


def _detector_types() -> dict[str, type]:
    from gangwatch.detectors.config import CONFIGS  # (not the detectors: reading a setting loads none of them)

    return CONFIGS


def default(path: str) -> Any:
    """The default of one setting (`worker.batch_max` -> 20000), read from its dataclass."""
    head, *rest = path.split(".")
    if head == DETECTORS:
        obj: Any = _detector_types()[rest[0]]()
        rest = rest[1:]
    else:
        sec = next(s for s in SECTIONS if s.name == head)
        obj = sec.dataclass()()
    for name in rest:
        obj = getattr(obj, name)
    return obj


# --- the pydantic model ---------------------------------------------------------------------------------


def _model_of(name: str, dc: type, inst: Any, names: list[str] | None = None) -> type:
    """A pydantic model of a dataclass (or of some of its fields), its defaults those of `inst`."""
    from pydantic import ConfigDict, Field, create_model

    hints = _hints(dc)
    spec: dict[str, Any] = {}
    for f in dataclasses.fields(dc):
        if names is not None and f.name not in names:
            continue
        tp, value = hints[f.name], getattr(inst, f.name)
        if dataclasses.is_dataclass(tp):
            sub = _model_of(f"{name}.{f.name}", tp, value)
            spec[f.name] = (sub, Field(default_factory=sub))
        else:
            spec[f.name] = (tp, Field(default=value))
    return create_model(name, __config__=ConfigDict(extra="forbid", allow_inf_nan=False), **spec)


@cache
def model() -> type:
    """The settings class (a pydantic-settings `BaseSettings`), built from the dataclasses once."""
    from pydantic import ConfigDict, Field, create_model
    from pydantic_settings import BaseSettings, SettingsConfigDict

    sections: dict[str, Any] = {}
    for sec in SECTIONS:
        dc = sec.dataclass()
        sections[sec.name] = _model_of(sec.name, dc, dc(), [f.name for f in sec.fields()])
    dets = {n: _model_of(f"detectors.{n}", t, t()) for n, t in _detector_types().items()}
    dets_model = create_model(DETECTORS, __config__=ConfigDict(extra="forbid"),
                              **{n: (m, Field(default_factory=m)) for n, m in dets.items()})
    sections[DETECTORS] = dets_model

    def customise(cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings):
        return _SOURCES.get()(settings_cls, init_settings)

    ns: dict[str, Any] = {
        "__annotations__": dict(sections),
        "model_config": SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter=DELIMITER,
                                           case_sensitive=False, extra="forbid", env_ignore_empty=True,
                                           env_parse_none_str="none"),
        "settings_customise_sources": classmethod(customise),
        **{k: Field(default_factory=m) for k, m in sections.items()},
    }
    return type("GangwatchSettings", (BaseSettings,), ns)


# the sources of the `load()` under way: pydantic-settings asks the class for them, `load()` decides them
_SOURCES: contextvars.ContextVar[Any] = contextvars.ContextVar("gangwatch_settings_sources")


# --- loading ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    """Where a setting's value came from: `kind` is default, toml, env or flag; `where` says which."""

    kind: str
    where: str = ""

    def __str__(self) -> str:
        return self.kind if not self.where else f"{self.kind} {self.where}"


DEFAULT = Origin("default")


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in flat.items():
        *heads, last = path.split(".")
        d = out
        for h in heads:
            d = d.setdefault(h, {})
            if not isinstance(d, dict):
                break
        else:
            d[last] = value
    return out


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        path = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, path + "."))
        else:
            out[path] = v
    return out


def _read_toml(path: Path, given_by: str) -> dict[str, Any]:
    if not path.exists():
        raise SettingsError(f"no such config file: {path} (given by {given_by})", 3)
    if path.is_dir():
        raise SettingsError(f"{path} is a directory, not a TOML config file (given by {given_by})", 3)
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"{path} is not valid TOML: {e}", 3) from None
    except OSError as e:
        raise SettingsError(f"cannot read {path}: {e.strerror or e}", 3) from None


@dataclass
class Layers:
    """The raw values of each source, flattened to dotted paths, and where each came from."""

    flags: dict[str, tuple[Any, str]] = field(default_factory=dict)  # path -> (value, the flag)
    env: dict[str, tuple[Any, str]] = field(default_factory=dict)  # path -> (raw, the variable)
    toml: dict[str, Any] = field(default_factory=dict)
    toml_file: str = ""

    def origin(self, path: str) -> Origin:
        """The layer that gave `path` (or a table under it, for a table nobody knows)."""
        for kind, layer in (("flag", self.flags), ("env", self.env), ("toml", self.toml)):
            hit = path if path in layer else next((p for p in layer if p.startswith(path + ".")), None)
            if hit is not None:
                return Origin(kind, self.toml_file if kind == "toml" else layer[hit][1])
        return DEFAULT


def _env_layer(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, tuple[Any, str]]]:
    """(the nested variables as pydantic-settings reads them, path -> (raw, variable) for both kinds)."""
    from pydantic_settings import EnvSettingsSource

    try:
        from pydantic_settings.sources.utils import parse_env_vars
    except ImportError:  # pydantic-settings before 2.8 kept it in one module
        from pydantic_settings.sources import parse_env_vars  # type: ignore[attr-defined,no-redef]

    class Env(EnvSettingsSource):
        def _load_env_vars(self) -> Mapping[str, str | None]:
            return parse_env_vars(environ, False, self.env_ignore_empty, self.env_parse_none_str)

    src = Env(model())
    try:
        nested = src()
    except Exception as e:  # pydantic-settings' SettingsError: a value it could not even parse (JSON)
        raise SettingsError(f"a GANGWATCH_* variable could not be read: {e}") from None
    where: dict[str, tuple[Any, str]] = {}
    upper = {k.upper(): v for k, v in environ.items() if v not in (None, "")}
    for name, path in ALIASES.items():
        if name in upper:
            where[path] = (upper[name], name)
    for path, raw in _flatten(nested).items():
        where[path] = (raw, env_name(path))
    return nested, where


def _alias_values(environ: Mapping[str, str]) -> dict[str, Any]:
    upper = {k.upper(): v for k, v in environ.items() if v not in (None, "")}
    return {path: (None if upper[name].strip().lower() == "none" else upper[name])
            for name, path in ALIASES.items() if name in upper}


_EXPECT = (
    ("float", "a number"), ("finite_number", "a finite number"), ("int", "an integer"),
    ("bool", "a boolean (true/false, 1/0, yes/no, on/off)"), ("string", "a string"),
    ("model", "a table of settings"), ("dict", "a table of settings"),
)


def _explain(err: Mapping[str, Any], layers: Layers) -> str:
    loc = [str(p) for p in err.get("loc", ()) if not isinstance(p, int)]
    path = ".".join(loc)
    kind = err.get("type", "")
    origin = layers.origin(path)
    src = "" if origin is DEFAULT else f" (from {origin})"
    got = masked(path, err.get("input"))  # a secret, or a URL's credentials, never reach the terminal
    if kind == "extra_forbidden":
        return f"unknown setting {path}{src}"
    for prefix, want in _EXPECT:
        if kind.startswith(prefix):
            return f"{path}{src}: expected {want}, got {got!r}"
    return f"{path}{src}: {err.get('msg', 'not a valid value')}, got {got!r}"


@dataclass(frozen=True)
class Row:
    setting: str
    value: Any  # as shown: secrets masked
    origin: Origin
    env: str  # the variable that sets it


class Loaded:
    """The effective settings and where each value came from."""

    def __init__(self, values: dict[str, Any], layers: Layers) -> None:
        self.values = values  # nested plain values, every setting
        self.layers = layers

    def get(self, path: str) -> Any:
        v: Any = self.values
        for k in path.split("."):
            v = v[k]
        return v

    def origin(self, path: str) -> Origin:
        return self.layers.origin(path)

    def source(self, path: str) -> str:
        return self.layers.origin(path).kind

    def rows(self) -> list[Row]:
        return [Row(path, masked(path, v), self.origin(path), env_name(path))
                for path, v in _flatten(self.values).items()]

    # --- the runtime dataclasses --------------------------------------------------------------------------

    def topic_settings(self):
        from gangwatch.schemas.topics import TopicSettings

        return _build(TopicSettings, self.values["topics"])

    def core_config(self):
        from gangwatch.triage.budgets import CoreConfig, TriageConfig

        types = _detector_types()
        return CoreConfig(**self.values["core"], triage=_build(TriageConfig, self.values["triage"]),
                          detectors={n: _build(t, self.values[DETECTORS][n]) for n, t in types.items()})

    def kafka_security(self):
        """The Kafka clients' SASL / SSL settings; a `SettingsError` when they do not fit together."""
        from gangwatch.schemas.security import KafkaSecurity

        try:
            return _build(KafkaSecurity, self.values["kafka_security"])
        except ValueError as e:
            raise SettingsError(f"kafka_security: {e}") from None

    def export_kafka(self, environ: typing.MutableMapping[str, str]) -> None:
        """Put the Kafka settings given by flags or TOML into `environ` (`GANGWATCH_KAFKA_*`), where every Kafka
        client of this process, and the processes it starts, reads them; the environment's own stay as they are."""
        self.kafka_security()  # refuse a combination that does not fit, before any client tries it
        for name, variable in KAFKA_ENV.items():
            path = f"kafka_security.{name}"
            value = self.get(path)
            if self.origin(path).kind in ("flag", "toml") and value is not None:
                environ[variable] = str(value).lower() if isinstance(value, bool) else str(value)

    def worker_settings(self):
        from gangwatch.streams.worker_settings import WorkerSettings

        return WorkerSettings(**self.values["worker"], **self.values["sinks"], topics=self.topic_settings(),
                              lateness_s=self.values["core"]["lateness_s"], core=self.core_config())


def _build(dc: type, values: Mapping[str, Any]) -> Any:
    """A dataclass from plain values (nested dataclasses too)."""
    hints = _hints(dc)
    kw = {}
    for f in dataclasses.fields(dc):
        if f.name not in values:
            continue
        v = values[f.name]
        kw[f.name] = _build(hints[f.name], v) if dataclasses.is_dataclass(hints[f.name]) else v
    return dc(**kw)


def load(flags: Mapping[str, tuple[Any, str]] | None = None, environ: Mapping[str, str] | None = None,
         config: str | os.PathLike[str] | None = None, config_given_by: str = "--config") -> Loaded:
    """The effective settings: `flags` (path -> (value, the flag that gave it)) over `environ` (default
    `os.environ`) over the TOML file `config` (default `$GANGWATCH_CONFIG`) over the defaults.

    Raises `SettingsError` (one line) for a bad value, an unknown key or a missing / broken file."""
    from pydantic import ValidationError
    from pydantic_settings import InitSettingsSource, PydanticBaseSettingsSource

    environ = os.environ if environ is None else environ
    cls = model()
    layers = Layers(flags=dict(flags or {}))
    if config is None and environ.get(CONFIG_ENV):
        config, config_given_by = environ[CONFIG_ENV], CONFIG_ENV
    toml: dict[str, Any] = {}
    if config is not None:
        toml = _read_toml(Path(config), config_given_by)
        layers.toml, layers.toml_file = _flatten(toml), str(config)
    nested_env, layers.env = _env_layer(environ)
    aliases = _nest(_alias_values(environ))
    flag_values = _nest({p: v for p, (v, _) in layers.flags.items()})

    class Given(PydanticBaseSettingsSource):
        def __init__(self, settings_cls: type, data: dict[str, Any]) -> None:
            super().__init__(settings_cls)
            self.data = data

        def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
            return self.data.get(field_name), field_name, False

        def __call__(self) -> dict[str, Any]:
            return self.data

    def sources(settings_cls: type, init_settings: Any) -> tuple[Any, ...]:
        # first wins: flags, nested variables, the older flat variables, the TOML file
        return (InitSettingsSource(settings_cls, flag_values), Given(settings_cls, nested_env),
                Given(settings_cls, aliases), Given(settings_cls, toml))

    token = _SOURCES.set(sources)
    try:
        obj = cls()
    except ValidationError as e:
        errors = e.errors()
        unknown = [".".join(map(str, x["loc"])) for x in errors if x["type"] == "extra_forbidden"
                   and layers.origin(".".join(map(str, x["loc"]))).kind == "toml"]
        if unknown:
            raise SettingsError(f"unknown setting{'s' if len(unknown) > 1 else ''} in {config}: "
                                f"{', '.join(unknown)} (`gangwatch config show` lists them all)", 3) from None
        raise SettingsError("; ".join(_explain(x, layers) for x in errors)) from None
    finally:
        _SOURCES.reset(token)
    return Loaded(obj.model_dump(), layers)
