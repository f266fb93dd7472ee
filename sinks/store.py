"""The ClickHouse store behind one small interface, with two adapters.

- `ChdbStore`: embedded ClickHouse (chDB) in this process; the default of
  `gangwatch replay`. Data persists under a directory.
- `ClickHouseStore`: a ClickHouse server over the native protocol
  (clickhouse-driver), as used in production and integration tests.

Both run the DDL of `sinks.tables` (adding the columns a store of an older
release lacks) and take rows as dicts. `open_store(url)` picks one by the URL
(`check_url` says what it takes); `create=False` opens only a store that exists
(`NoSuchStore` otherwise), creating nothing.
"""

from __future__ import annotations

import datetime as _dt
import errno
import logging
import os
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

import orjson
from gangwatch.schemas.security import MASK
from gangwatch.sinks.tables import ADDED_COLUMNS, ddl, upgrades

USER_ENV = "GANGWATCH_CLICKHOUSE_USER"
PASSWORD_ENV = "GANGWATCH_CLICKHOUSE_PASSWORD"
_AUTH_CODES = frozenset({192, 193, 194, 195, 516})  # unknown user, wrong password, required, IP not allowed, failed
# Server error codes that say "not now" rather than "never": timeouts, network, overload, memory, too many
# parts/queries, read-only replicas, ZooKeeper/Keeper trouble, a cancelled or aborted query. Every other coded
# error (unknown table or column, type mismatch, parse errors, a refused login, ...) is permanent: the same
# rows will fail the same way.
TRANSIENT_CODES = frozenset({
    3, 32,  # UNEXPECTED_END_OF_FILE, ATTEMPT_TO_READ_AFTER_EOF (the connection went away mid-answer)
    159, 173, 202, 203, 209, 210,  # TIMEOUT_EXCEEDED, CANNOT_ALLOCATE_MEMORY, TOO_MANY_SIMULTANEOUS_QUERIES,
    # NO_FREE_CONNECTION, SOCKET_TIMEOUT, NETWORK_ERROR
    225, 236, 241, 242, 244, 252, 255, 279,  # NO_ZOOKEEPER, ABORTED, MEMORY_LIMIT_EXCEEDED, TABLE_IS_READ_ONLY,
    # UNEXPECTED_ZOOKEEPER_ERROR, TOO_MANY_PARTS, TOO_MANY_RETRIES_TO_FETCH_PARTS, ALL_CONNECTION_TRIES_FAILED
    364, 369, 394, 425, 999,  # RECEIVED_ERROR_TOO_MANY_REQUESTS, ALL_REPLICAS_ARE_STALE, QUERY_WAS_CANCELLED,
    # SYSTEM_ERROR, KEEPER_EXCEPTION
})
_CODE_IN_TEXT = re.compile(r"\bCode: (\d+)\b")
# A database name as ClickHouse takes it unquoted (the DDL names the database unquoted).
DATABASE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FORMS = "chdb:PATH (embedded; a plain PATH too) or clickhouse[s]://[USER[:PASSWORD]@]HOST[:PORT][/DB] (a server)"
HELLO_TIMEOUT_S = 5.0  # a native-protocol server answers the first query at once; an HTTP port never does


READONLY_CODE = 164  # READONLY: what a store opened with readonly=True answers a write, DDL or setting change


class NoSuchStore(LookupError):
    """`open_store(..., create=False)` of a store that does not exist (a chDB folder, a server's database)."""


def check_url(url: str) -> None:
    """Raise ValueError, one line naming the accepted forms, for a store URL `open_store` cannot take;
    FileNotFoundError for a TLS file (`ca_certs`, `certfile`, `keyfile`) it names that is not there."""
    scheme, colon, rest = url.partition(":")
    if scheme in ("clickhouse", "clickhouses"):
        if not rest.startswith("//"):
            raise ValueError(f"malformed store URL: {scheme}: must be followed by //HOST; want {FORMS}")
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:  # not a number up to 65535
            port = 0
        if port == 0:
            raise ValueError(f"bad port in the store URL (1-65535): want {FORMS}")
        for key, values in parse_qs(parts.query).items():  # clickhouse-driver would say only "No such file"
            if key in ("ca_certs", "certfile", "keyfile") and not Path(values[-1]).is_file():
                raise FileNotFoundError(errno.ENOENT, f"no such file for ?{key}= in the store URL", values[-1])
        db = parts.path.strip("/")
        if db and not DATABASE_NAME.fullmatch(db):
            raise ValueError(f"bad database name {db!r} in the store URL: use letters, digits and underscores, not "
                             "starting with a digit (e.g. clickhouse://HOST:9000/gangwatch)")
    elif scheme == "chdb":
        if not rest:
            raise ValueError(f"no path in store URL 'chdb:': want {FORMS}")
    elif colon and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]+", scheme):
        raise ValueError(f"unknown store URL scheme {scheme + ':'!r}: want {FORMS}")


def error_line(exc: BaseException) -> str:
    """A store's error as one line: the server's message without its stack trace."""
    text = str(exc).split("Stack trace:")[0]
    return " ".join(text.split()) or type(exc).__name__


class Store(Protocol):
    def create_tables(self) -> None: ...

    def insert(self, table: str, rows: list[dict[str, Any]]) -> None: ...

    def query(self, sql: str) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


class ChdbStore:
    """Embedded ClickHouse via chDB; one store directory per process. `readonly=True` sets the session's
    `readonly` (1: it only reads, and the setting cannot be changed back) before any query."""

    def __init__(self, path: str | Path, *, create: bool = True, readonly: bool = False) -> None:
        from chdb import session  # imported here: chDB loads a large library

        self.path = Path(path)
        if not create and not self.path.is_dir():
            raise NoSuchStore(f"no store at {self.path} (a replay writes one to OUT/store); nothing was created")
        self.path.mkdir(parents=True, exist_ok=True)
        self._session = session.Session(str(self.path))
        if readonly:
            self._session.query("SET readonly = 1")

    def create_tables(self) -> None:
        for stmt in ddl():
            self._session.query(stmt)
        for stmt in upgrades(_columns(self.query)):
            self._session.query(stmt)

    def insert(self, table: str, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        body = b"\n".join(orjson.dumps(r) for r in rows).decode()
        self._session.query(f"INSERT INTO {table} FORMAT JSONEachRow\n{body}\n")

    def query(self, sql: str) -> list[dict[str, Any]]:
        res = self._session.query(sql, "JSONEachRow")
        data = res.bytes() if hasattr(res, "bytes") else bytes(res)
        return [orjson.loads(line) for line in data.splitlines() if line.strip()]

    def close(self) -> None:
        self._session.close()


class ClickHouseStore:
    """A ClickHouse server over the native TCP protocol.

    `user` and `password` fall back to `GANGWATCH_CLICKHOUSE_USER` and
    `GANGWATCH_CLICKHOUSE_PASSWORD` (of `env`, default the process environment),
    then to ClickHouse's `default` user with no password; `secure=True` speaks TLS
    (other clickhouse-driver options, `ca_certs`, `verify`, ..., pass through).
    `from_url` takes ``clickhouse[s]://[user[:password]@]host[:port][/db][?secure=1&ca_certs=...]``.
    The database is created when missing, unless `create=False` (then `NoSuchStore`). The first round trip
    waits `HELLO_TIMEOUT_S` at most: a port that does not speak the native protocol (the HTTP port, 8123)
    is a ConnectionError saying so, as is a refused login. The password is never part of a repr or a log line.
    `readonly=True` sends the server's `readonly` setting (1) with every query: it refuses writes, DDL and
    setting changes (code 164), whatever the user may do otherwise.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 9000, database: str = "default", *,
                 user: str | None = None, password: str | None = None, env: Mapping[str, str] | None = None,
                 create: bool = True, readonly: bool = False, **client_kwargs: Any) -> None:
        from clickhouse_driver import Client

        if not DATABASE_NAME.fullmatch(database):
            raise ValueError(f"bad database name {database!r}: use letters, digits and underscores, not starting "
                             "with a digit")
        env = os.environ if env is None else env
        auth = {"user": user if user is not None else env.get(USER_ENV) or "default",
                "password": password if password is not None else env.get(PASSWORD_ENV, "")}
        self.host, self.port, self.database, self.user = host, port, database, auth["user"]
        self.secure = bool(client_kwargs.get("secure"))
        settings = {**client_kwargs.pop("settings", {}), **({"readonly": 1} if readonly else {})}
        self._client = Client(host=host, port=port, database=database, **auth, **client_kwargs,
                              **({"settings": settings} if settings else {}))
        first = Client(host=host, port=port, **auth, **{**client_kwargs, "send_receive_timeout": HELLO_TIMEOUT_S})
        driver_log = logging.getLogger("clickhouse_driver.connection")  # logs each failed connect's traceback
        quiet, driver_log.disabled = driver_log.disabled, True
        try:  # the first round trip: a refused login or a port of another protocol is one line, said here
            if not first.execute(f"SELECT 1 FROM system.databases WHERE name = '{database}'"):
                if not create:
                    raise NoSuchStore(f"database {database!r} does not exist on ClickHouse at {host}:{port} (a "
                                      "replay or worker with this --store creates it); nothing was created")
                first.execute(f"CREATE DATABASE IF NOT EXISTS {database}")
        except NoSuchStore:
            raise
        except Exception as e:
            if getattr(e, "code", None) in _AUTH_CODES:
                raise ConnectionError(f"ClickHouse at {host}:{port} refused user {self.user!r}: wrong password or "
                                      f"unknown user (code {e.code}); set the user and password in the store "
                                      f"URL or {USER_ENV}/{PASSWORD_ENV}") from None
            if isinstance(e, EOFError) or type(e).__name__ in _NOT_NATIVE:
                raise ConnectionError(_not_native(host, port, e, self.secure)) from None
            raise
        finally:
            driver_log.disabled = quiet
            first.disconnect()

    @classmethod
    def from_url(cls, url: str, env: Mapping[str, str] | None = None, *, create: bool = True,
                 readonly: bool = False) -> ClickHouseStore:
        """A store from a `clickhouse://` or `clickhouses://` URL (clickhouse-driver's URL syntax)."""
        from clickhouse_driver.util.helpers import parse_url

        host, kw = parse_url(url)
        secure = bool(kw.get("secure"))
        port = kw.pop("port", 9440 if secure else 9000)
        database = kw.pop("database", "") or "default"
        return cls(host or "127.0.0.1", port, database, env=env, create=create, readonly=readonly, **kw)

    def __repr__(self) -> str:
        scheme = "clickhouses" if self.secure else "clickhouse"
        return f"ClickHouseStore({scheme}://{self.user}:{MASK}@{self.host}:{self.port}/{self.database})"

    __str__ = __repr__

    def create_tables(self) -> None:
        for stmt in ddl():
            self._client.execute(stmt)
        for stmt in upgrades(_columns(self.query)):
            self._client.execute(stmt)

    def insert(self, table: str, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        cols = list(rows[0])
        self._client.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES",
                             [_server_row(r, cols) for r in rows])

    def query(self, sql: str) -> list[dict[str, Any]]:
        rows, columns = self._client.execute(sql, with_column_types=True)
        names = [c[0] for c in columns]
        return [{n: _plain(v) for n, v in zip(names, row, strict=True)} for row in rows]

    def close(self) -> None:
        self._client.disconnect()


def store_error_transient(exc: BaseException) -> bool | None:
    """Whether a store error may pass by itself: True (retry), False (permanent), None (not a store error).

    clickhouse-driver: its network errors, socket timeouts and unexpected packets are transient, a server
    exception by its code (`TRANSIENT_CODES`), its client-side type errors (TypeMismatchError, unknown type,
    string too large) permanent. chDB raises a plain exception whose text carries the server's ``Code: N``.
    A connection refused or reset arrives as an OSError, which is the caller's to classify.
    """
    module = type(exc).__module__ or ""
    if module.startswith("clickhouse_driver"):
        name = type(exc).__name__
        if name in ("NetworkError", "SocketTimeoutError", "UnexpectedPacketFromServerError",
                    "UnknownPacketFromServerError", "PartiallyConsumedQueryError"):
            return True
        code = getattr(exc, "code", None)
        if name == "ServerException" or isinstance(code, int):
            return code in TRANSIENT_CODES
        return False
    if module.startswith("chdb") or (type(exc) is RuntimeError and "DB::Exception" in str(exc)):
        m = _CODE_IN_TEXT.search(str(exc))
        return bool(m) and int(m.group(1)) in TRANSIENT_CODES
    return None


def _columns(query: Callable[[str], list[dict[str, Any]]]) -> dict[str, set[str]]:
    """The columns now in the tables that have `ADDED_COLUMNS` (current database)."""
    names = ", ".join(f"'{t}'" for t in sorted(ADDED_COLUMNS))
    out: dict[str, set[str]] = {}
    for row in query(f"SELECT table, name FROM system.columns WHERE database = currentDatabase() "
                     f"AND table IN ({names})"):
        out.setdefault(row["table"], set()).add(row["name"])
    return out


def _server_row(row: dict[str, Any], cols: Iterable[str]) -> tuple:
    out = []
    for c in cols:
        v = row[c]
        if c == "event_time":
            v = _dt.datetime.fromtimestamp(v, _dt.UTC).replace(tzinfo=None)
        out.append(v)
    return tuple(out)


def _plain(v: Any) -> Any:
    """Server values in the shape chDB's JSONEachRow gives (DateTime as 'YYYY-MM-DD hh:mm:ss')."""
    if isinstance(v, _dt.datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(v, tuple):
        return list(v)
    return v


# clickhouse-driver's errors when what answers is not a native-protocol server (or nothing answers in time)
_NOT_NATIVE = frozenset({"SocketTimeoutError", "UnexpectedPacketFromServerError", "UnknownPacketFromServerError",
                         "NetworkError"})


def _not_native(host: str, port: int, exc: BaseException, secure: bool) -> str:
    """What a failed first round trip says about the port, as one line that names the fix."""
    detail = error_line(exc)
    if "certificate verify failed" in detail.lower():
        return (f"ClickHouse at {host}:{port}: its TLS certificate is not trusted ({detail}): give the CA that "
                "signed it in the store URL, ?ca_certs=/path/to/ca.pem")
    answer = http_answer(host, port)
    native = b"clickhouse-client" in answer  # the plain native port answers an HTTP request with this note
    if secure and (answer or "wrong version number" in detail.lower()):
        what = ("ClickHouse's plain native port" if native else "an HTTP port" if answer else "a plain TCP port")
        return (f"{host}:{port} does not speak TLS: it is {what} ({detail}); give the TLS native port (9440 by "
                "default: clickhouses://HOST:9440/DB), or drop TLS for this port (clickhouse://, no secure=1)")
    if answer and not native:
        return (f"{host}:{port} answers HTTP, not ClickHouse's native protocol: it looks like the HTTP port (8123 "
                "by default); give the native TCP port (9000 by default, 9440 with TLS): clickhouse://HOST:9000/DB")
    return (f"{host}:{port} does not answer as a native-protocol ClickHouse server ({detail}; waited "
            f"{HELLO_TIMEOUT_S:.0f} s at most): give its native TCP port (9000 by default, 9440 with TLS)")


def http_answer(host: str, port: int) -> bytes:
    """The first bytes an HTTP server at host:port answers `GET /ping` with (asked only once another protocol's
    handshake failed); b"" when nothing answers HTTP."""
    try:
        with socket.create_connection((host, port), timeout=2.0) as sock:
            sock.settimeout(2.0)
            sock.sendall(b"GET /ping HTTP/1.0\r\n\r\n")
            got = b""
            while len(got) < 512:
                chunk = sock.recv(512 - len(got))
                if not chunk:
                    break
                got += chunk
    except OSError:
        pass
    return got if got.startswith(b"HTTP/") else b""


def open_store(url: str, *, create: bool = True, readonly: bool = False) -> Store:
    """`chdb:PATH` (embedded) or `clickhouse[s]://[user[:password]@]HOST:PORT[/DB][?secure=1...]` (server);
    ValueError for a URL `check_url` refuses; with `create=False`, `NoSuchStore` for a store not there; with
    `readonly=True`, a store that refuses every write, DDL and setting change (the engine's `readonly` setting)."""
    check_url(url)
    if url.startswith(("clickhouse://", "clickhouses://")):
        return ClickHouseStore.from_url(url, create=create, readonly=readonly)
    return ChdbStore(url[len("chdb:"):] if url.startswith("chdb:") else url, create=create, readonly=readonly)
