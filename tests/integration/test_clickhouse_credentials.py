"""ClickHouse credentials from a store URL reach the real server: the right password works, a wrong one is
refused in one line that names neither password."""

from __future__ import annotations

import logging

import pytest
from gangwatch.sinks.store import ClickHouseStore, open_store

from gangwatch.cli import main

pytestmark = pytest.mark.integration

WRONG = "not-the-password-Zq81"


def test_an_explicit_user_and_empty_password_in_the_url_reach_the_server(clickhouse_addr, unique):
    host, port = clickhouse_addr
    store = open_store(f"clickhouse://default:@{host}:{port}/{unique}")  # the default user has no password here
    try:
        assert isinstance(store, ClickHouseStore) and (store.user, store.database) == ("default", unique)
        store.create_tables()
        assert store.query("SELECT currentDatabase() AS db") == [{"db": unique}]
    finally:
        store.query(f"DROP DATABASE IF EXISTS {unique}")
        store.close()


@pytest.mark.parametrize("userinfo, code", [(f"default:{WRONG}", 193), ("nobody-gw:", 192)])
def test_a_wrong_password_or_user_is_refused_by_the_server(clickhouse_addr, userinfo, code):
    host, port = clickhouse_addr
    with pytest.raises(ConnectionError) as e:
        open_store(f"clickhouse://{userinfo}@{host}:{port}/default")
    assert f"code {code}" in str(e.value) and WRONG not in str(e.value)


def test_replay_with_a_wrong_store_password_says_so_without_it(clickhouse_addr, unique, tmp_path, caplog, capsys):
    host, port = clickhouse_addr
    src = tmp_path / "in.jsonl"
    src.write_text('{"kind":"job","v":1,"ts":1.0,"job":"j1","world":2}\n')
    with caplog.at_level(logging.DEBUG):
        code = main(["replay", str(src), "--out", str(tmp_path / "out"),
                     "--store", f"clickhouse://default:{WRONG}@{host}:{port}/{unique}", "--connect-timeout", "5"])
    out, err = capsys.readouterr()
    assert code == 5 and "refused user 'default': wrong password" in err
    for text in (out, err, caplog.text):
        assert WRONG not in text
