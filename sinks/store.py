"""The ClickHouse store behind one small interface, with two adapters.

- `ChdbStore`: embedded ClickHouse (chDB) in this process; the default of
  `gangwatch replay`. Data persists under a directory.
- `ClickHouseStore`: a ClickHouse server over the native protocol
  (clickhouse-driver), as used in production and integration tests.

Both run the DDL of `sinks.tables` (adding the columns a store of an older
release lacks) and take rows as dicts.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

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


class Store(Protocol):
    def create_tables(self) -> None: ...

    def insert(self, table: str, rows: list[dict[str, Any]]) -> None: ...

    def query(self, sql: str) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


class ChdbStore:
    """Embedded ClickHouse via chDB; one store directory per process."""

    def __init__(self, path: str | Path) -> None:
        from chdb import session  # imported here: chDB loads a large library

        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._session = session.Session(str(self.path))

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
    The password is never part of a repr or a log line.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 9000, database: str = "default", *,
                 user: str | None = None, password: str | None = None, env: Mapping[str, str] | None = None,
                 **client_kwargs: Any) -> None:
        from clickhouse_driver import Client

        env = os.environ if env is None else env
        auth = {"user": user if user is not None else env.get(USER_ENV) or "default",
                "password": password if password is not None else env.get(PASSWORD_ENV, "")}
        self.host, self.port, self.database, self.user = host, port, database, auth["user"]
        self.secure = bool(client_kwargs.get("secure"))
        self._client = Client(host=host, port=port, database=database, **auth, **client_kwargs)
        try:  # the first round trip: a refused login is said in one line (ConnectionError), without the password
            if database != "default":
                Client(host=host, port=port, **auth, **client_kwargs).execute(
                    f"CREATE DATABASE IF NOT EXISTS {database}")
            else:
                self._client.execute("SELECT 1")
        except Exception as e:
            if getattr(e, "code", None) in _AUTH_CODES:
                raise ConnectionError(f"ClickHouse at {host}:{port} refused user {self.user!r}: wrong password or "
                                      f"unknown user (code {e.code}); set the user and password in the store "
                                      f"URL or {USER_ENV}/{PASSWORD_ENV}") from None
            raise

    @classmethod
    def from_url(cls, url: str, env: Mapping[str, str] | None = None) -> ClickHouseStore:
        """A store from a `clickhouse://` or `clickhouses://` URL (clickhouse-driver's URL syntax)."""
        from clickhouse_driver.util.helpers import parse_url

        host, kw = parse_url(url)
        secure = bool(kw.get("secure"))
        port = kw.pop("port", 9440 if secure else 9000)
        database = kw.pop("database", "default")
        return cls(host or "127.0.0.1", port, database, env=env, **kw)

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


def open_store(url: str) -> Store:
    """`chdb:PATH` (embedded) or `clickhouse[s]://[user[:password]@]HOST:PORT[/DB][?secure=1...]` (server)."""
    if url.startswith(("clickhouse://", "clickhouses://")):
        return ClickHouseStore.from_url(url)
    return ChdbStore(url[len("chdb:"):] if url.startswith("chdb:") else url)
