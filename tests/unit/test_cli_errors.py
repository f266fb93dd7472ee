"""Every user error is one line with its own exit code and no traceback; `--debug` shows the traceback."""

from __future__ import annotations

import gzip
import socket
from pathlib import Path

import orjson
import pytest

from gangwatch.cli import build_parser, main
from gangwatch.cli.options import (
    EXIT_CORRUPT,
    EXIT_EXTRA,
    EXIT_INPUT,
    EXIT_INTERNAL,
    EXIT_SERVICE,
    EXIT_USAGE,
    UserError,
    resolve,
)
from tests.helpers import need_module

pytestmark = pytest.mark.unit


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err + out
    return code, out, err


def one_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ": error: " in ln or ": internal error: " in ln]
    assert len(lines) == 1, err
    return lines[0]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def stream(tmp_path_factory) -> Path:
    """A small simulated job with a fault, as a .jsonl.gz."""
    from gangwatch.producers.simulate import Fault, Scenario, write

    sc = Scenario("cli", seed=3, tp=4, pp=1, dp=4, gpus_per_node=4, duration_s=120.0,
                  faults=(Fault("xid79", at_s=60.0, node="n001", params={"gpu": 1}),))
    path, _ = write(sc, tmp_path_factory.mktemp("sim"))
    return path


# --- paths --------------------------------------------------------------------------------------


def test_replay_of_a_directory(capsys, tmp_path):
    code, _, err = run(capsys, "replay", str(tmp_path), "--out", str(tmp_path / "o"))
    assert code == EXIT_INPUT and "is a directory" in one_error(err)


def test_replay_of_a_missing_file(capsys, tmp_path):
    code, _, err = run(capsys, "replay", str(tmp_path / "nope.jsonl"))
    assert code == EXIT_INPUT and "no such file" in one_error(err)


def test_out_naming_an_existing_file(capsys, tmp_path, stream):
    (tmp_path / "f").write_text("x")
    code, _, err = run(capsys, "replay", str(stream), "--out", str(tmp_path / "f"), "--no-store")
    assert code == EXIT_INPUT and "is a file; give a directory" in one_error(err)


def test_out_that_cannot_be_written(capsys, tmp_path, stream):
    (tmp_path / "f").write_text("x")
    code, _, err = run(capsys, "replay", str(stream), "--out", str(tmp_path / "f" / "sub"), "--no-store")
    assert code == EXIT_INPUT and "cannot write to --out" in one_error(err)


# --- corrupt and truncated input ------------------------------------------------------------------


def test_truncated_gzip_keeps_what_was_read_everywhere(capsys, tmp_path, stream):
    data = stream.read_bytes()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: int(len(data) * 0.95)])
    out = tmp_path / "o"
    code, stdout, err = run(capsys, "replay", str(cut), "--out", str(out))
    line = one_error(err)
    assert code == EXIT_CORRUPT and "stopped after line" in line and str(cut) in line
    findings = (out / "findings.jsonl").read_bytes().splitlines()
    assert findings, "what was read before the cut must be replayed"
    code, rows, _ = run(capsys, "store", "query", "SELECT count() AS n FROM gw_findings", "--out", str(out),
                        "--format", "jsonl")
    assert code == 0 and orjson.loads(rows)["n"] == len(findings)
    rejected = [orjson.loads(x) for x in (out / "rejected.jsonl").read_bytes().splitlines()]
    assert rejected[-1]["reason"].startswith("input stopped")


def test_ingest_refuses_random_bytes_as_pyspy_dumps(capsys, tmp_path):
    (tmp_path / "dump_rank0.txt").write_bytes(bytes(range(256)) * 20)
    code, _, err = run(capsys, "ingest", "pyspy", str(tmp_path))
    assert code == EXIT_INPUT and "is not a py-spy dump" in one_error(err)


def test_ingest_refuses_text_that_is_not_a_pyspy_dump(capsys, tmp_path):
    (tmp_path / "dump_rank0.txt").write_text("hello\nworld\n" * 50)
    code, _, err = run(capsys, "ingest", "pyspy", str(tmp_path))
    assert code == EXIT_INPUT and "no 'Thread <id>" in one_error(err)


def test_ingest_kmsg_refuses_a_binary_file(capsys, tmp_path):
    (tmp_path / "k.log").write_bytes(b"\x7fELF\0\0\0" * 100)
    code, _, err = run(capsys, "ingest", "kmsg", str(tmp_path / "k.log"))
    assert code == EXIT_INPUT and "is not a kernel log" in one_error(err)


def test_replay_of_node_events_only_says_why_nothing_was_found(capsys, tmp_path, real_data):
    hw = tmp_path / "hw.jsonl"
    assert run(capsys, "ingest", "kmsg", str(real_data / "kmsg" / "h100-xid119.log"), "--out", str(hw))[0] == 0
    code, out, _ = run(capsys, "replay", str(hw), "--out", str(tmp_path / "o"), "--no-store")
    assert code == 0 and "nothing found" in out and "only node events" in out and "--job" in out


# --- reruns ---------------------------------------------------------------------------------------


def _store_count(capsys, out: Path) -> int:
    code, rows, _ = run(capsys, "store", "query", "SELECT count() AS n FROM gw_findings", "--out", str(out),
                        "--format", "jsonl")
    assert code == 0
    return orjson.loads(rows)["n"]


def test_rerun_into_the_same_out_replaces_the_store_and_append_adds(capsys, tmp_path, stream):
    out = tmp_path / "o"
    assert run(capsys, "replay", str(stream), "--out", str(out), "-q")[0] == 0
    once = _store_count(capsys, out)
    assert once > 0
    assert run(capsys, "replay", str(stream), "--out", str(out), "-q")[0] == 0
    assert _store_count(capsys, out) == once == len((out / "findings.jsonl").read_bytes().splitlines())
    assert run(capsys, "replay", str(stream), "--out", str(out), "-q", "--append")[0] == 0
    assert _store_count(capsys, out) == 2 * once == len((out / "findings.jsonl").read_bytes().splitlines())


# --- services -------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["topics", "list"], ["topics", "create"], ["worker"], ["publish", "{stream}"],
    ["replay", "{stream}", "--no-store", "--publish", "127.0.0.1:{port}"],
])
def test_unreachable_kafka_is_one_line_after_a_bounded_visible_wait(capsys, tmp_path, stream, argv):
    port = closed_port()
    argv = [a.format(stream=stream, port=port) for a in argv]
    if "--publish" not in argv:
        argv += ["--bootstrap", f"127.0.0.1:{port}"]
    code, _, err = run(capsys, *argv, "--connect-timeout", "1", *(["--out", str(tmp_path / "o")]
                                                                   if argv[0] == "replay" else []))
    assert code == EXIT_SERVICE
    assert "cannot reach Kafka" in one_error(err) and f"127.0.0.1:{port}" in one_error(err)
    assert err.count("waiting for Kafka") == 1 and "up to 1 s (--connect-timeout)" in err  # one line, not one a try
    assert len(err.splitlines()) == 2


def test_an_unknown_host_waits_with_one_line_then_says_why(capsys):
    code, _, err = run(capsys, "topics", "list", "--bootstrap", "no-such-host.invalid:9092", "--connect-timeout", "2")
    assert code == EXIT_SERVICE and "cannot reach Kafka at no-such-host.invalid:9092" in one_error(err)
    assert err.count("waiting for Kafka") == 1 and len(err.splitlines()) == 2


def _server(answer):
    """A TCP server on a free port that answers every connection's first bytes with `answer` (None: silence; a
    function: of those bytes), as a port of another service does to Kafka's request; (port, close)."""
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            said = answer(conn.recv(64)) if callable(answer) else answer
            if said is not None:
                conn.sendall(said)

    threading.Thread(target=serve, daemon=True).start()

    def close() -> None:
        server.close()
        for conn in held:
            conn.close()

    return server.getsockname()[1], close


@pytest.mark.parametrize(("answer", "says"), [
    (None, "did not answer Kafka's ApiVersions request in 1 s"),
    (b"HTTP/1.0 400 Bad Request\r\n\r\n", "answers HTTP"),
    (b"SSH-2.0-OpenSSH_9.6\r\n", "with something else (another protocol)"),
])
@pytest.mark.parametrize("argv", [["topics", "list"], ["publish", "{stream}"], ["worker"]])
def test_a_bootstrap_port_that_is_not_kafka_is_named_within_the_connect_timeout(capsys, stream, answer, says, argv):
    port, close = _server(answer)
    try:
        code, _, err = run(capsys, *[a.format(stream=stream) for a in argv], "--bootstrap", f"127.0.0.1:{port}",
                           "--connect-timeout", "1")
    finally:
        close()
    line = one_error(err)
    assert code == EXIT_SERVICE and f"--bootstrap 127.0.0.1:{port} is not Kafka" in line and says in line
    assert len(err.splitlines()) == 1 and "waiting" not in err


def test_a_tls_file_the_store_url_names_that_is_not_there_is_named(capsys, tmp_path, stream):
    url = f"clickhouses://127.0.0.1:{closed_port()}/gw?ca_certs={tmp_path / 'ca.pem'}"
    for argv in (["store", "query", "SELECT 1"], ["replay", str(stream), "--out", str(tmp_path / "o")]):
        code, _, err = run(capsys, *argv, "--store", url)
        assert code == EXIT_INPUT and f"no such file for ?ca_certs= in the store URL: {tmp_path / 'ca.pem'}" in \
            one_error(err) and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_unreachable_clickhouse(capsys, tmp_path, stream):
    port = closed_port()
    code, _, err = run(capsys, "replay", str(stream), "--out", str(tmp_path / "o"),
                       "--store", f"clickhouse://127.0.0.1:{port}/db", "--connect-timeout", "1")
    assert code == EXIT_SERVICE and "cannot reach ClickHouse" in one_error(err)


# --- options and environment ----------------------------------------------------------------------


def test_simulate_with_an_unknown_node(capsys, tmp_path):
    code, _, err = run(capsys, "simulate", "--fault", "xid79:60:n999", "--out", str(tmp_path))
    assert code == EXIT_USAGE and "unknown node 'n999'" in one_error(err)


def test_simulate_with_a_malformed_fault(capsys, tmp_path):
    code, _, err = run(capsys, "simulate", "--fault", "xid79", "--out", str(tmp_path))
    assert code == EXIT_USAGE and "bad --fault 'xid79'" in one_error(err)


def test_simulate_s_help_and_its_error_list_the_fault_kinds_the_simulator_takes(capsys, tmp_path):
    """Issue 47: the help listed 11 kinds, the error 13. Both come from one table, which is the simulator's."""
    from gangwatch.producers.simulate import FAULT_KINDS, Fault

    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps the epilog
    listed = shown.split("fault kinds: ", 1)[1]
    assert [k for k in FAULT_KINDS if f"{k}: " in listed] == list(FAULT_KINDS)
    code, _, err = run(capsys, "simulate", "--fault", "bogus:1:n001", "--out", str(tmp_path))
    assert code == EXIT_USAGE and one_error(err).endswith("one of " + ", ".join(FAULT_KINDS))
    for kind in FAULT_KINDS:  # every kind listed is one the simulator takes
        Fault(kind, 1.0, node="n001")


def test_an_option_a_command_does_not_take_is_said_by_that_command_with_the_one_it_resembles(capsys, tmp_path):
    """Issue 47: `replay ... --output DIR` got the top-level usage and "unrecognized arguments"."""
    with pytest.raises(SystemExit) as exit_:
        main(["replay", str(tmp_path / "x.jsonl"), "--output", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_.value.code == EXIT_USAGE and err.startswith("usage: gangwatch replay ")
    assert one_error(err) == (f"gangwatch replay: error: unrecognized arguments: --output {tmp_path}; did you mean "
                              "--out? (gangwatch replay --help lists them)")
    with pytest.raises(SystemExit):
        main(["simulate", "--zzz"])
    assert "did you mean" not in one_error(capsys.readouterr().err)  # nothing like it: nothing suggested


@pytest.mark.parametrize(("argv", "command", "meant"), [
    (["topics", "create", "--app-idd", "x"], "topics create", "--app-id"),
    (["store", "query", "SELECT 1", "--outt", "x"], "store query", "--out"),
])
def test_an_option_a_subcommand_does_not_take_is_said_by_that_subcommand(capsys, argv, command, meant):
    """Issue 47, one level down: `topics create --app-idd` got the usage of `topics` (ACTION ...) and no
    suggestion, since the options it resembles are the subcommand's."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == EXIT_USAGE and err.startswith(f"usage: gangwatch {command} ")
    assert one_error(err) == (f"gangwatch {command}: error: unrecognized arguments: {' '.join(argv[-2:])}; did you "
                              f"mean {meant}? (gangwatch {command} --help lists them)")


def test_a_bad_environment_value_names_the_variable_and_spares_help(capsys, monkeypatch):
    monkeypatch.setenv("GANGWATCH_BATCH_MAX", "abc")
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    with pytest.raises(SystemExit) as e:
        main(["worker", "--help"])
    assert e.value.code == 0 and "GANGWATCH_BATCH_MAX" in capsys.readouterr().out
    code, _, err = run(capsys, "worker")
    line = one_error(err)
    assert code == EXIT_USAGE and "worker.batch_max (from env GANGWATCH_BATCH_MAX)" in line and "got 'abc'" in line


@pytest.mark.parametrize(("raw", "want"), [("false", False), ("0", False), ("off", False), ("yes", True),
                                           ("1", True)])
def test_boolean_environment_values(raw, want):
    args = build_parser().parse_args(["worker"])
    resolve(args, {"GANGWATCH_SILENCE": raw})
    assert args.silence is want


def test_a_flag_wins_over_the_environment():
    args = build_parser().parse_args(["worker", "--batch-max", "7"])
    resolve(args, {"GANGWATCH_BATCH_MAX": "9"})
    assert args.batch_max == 7
    args = build_parser().parse_args(["worker"])
    resolve(args, {"GANGWATCH_BATCH_MAX": "9"})
    assert args.batch_max == 9


def test_every_option_with_a_value_names_its_variable_in_help(capsys):
    for cmd in (["worker"], ["replay"], ["publish"], ["topics", "create"]):
        with pytest.raises(SystemExit):
            main([*cmd, "--help"])
        text = capsys.readouterr().out
        assert text.count("env GANGWATCH_") >= 3, cmd


# --- missing extras and bugs ----------------------------------------------------------------------


def test_a_missing_extra_names_the_extra(capsys, monkeypatch, tmp_path, stream):
    monkeypatch.setitem(__import__("sys").modules, "chdb", None)
    code, _, err = run(capsys, "replay", str(stream), "--out", str(tmp_path / "o"))
    assert code == EXIT_EXTRA and "pip install 'gangwatch[embedded]'" in one_error(err)


def test_an_internal_error_is_one_line_and_debug_shows_the_traceback(capsys, monkeypatch, tmp_path, stream):
    from gangwatch.streams import replay

    def broken(*a, **k):
        raise KeyError("boom")

    monkeypatch.setattr(replay, "run", broken)
    code, _, err = run(capsys, "replay", str(stream), "--out", str(tmp_path / "o"), "--no-store")
    assert code == EXIT_INTERNAL and "--debug" in one_error(err)
    with pytest.raises(KeyError):
        main(["replay", str(stream), "--out", str(tmp_path / "o"), "--no-store", "--debug"])


def test_gzip_member_garbage_is_reported_not_raised(capsys, tmp_path):
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(b'{"kind":"heartbeat"}\n')[:10] + b"garbage" * 10)
    code, _, err = run(capsys, "replay", str(bad), "--out", str(tmp_path / "o"), "--no-store")
    assert code == EXIT_CORRUPT and "stopped after line" in one_error(err)


# --- issue 24: second contact -------------------------------------------------------------------


def test_topics_tail_from_the_beginning_without_a_timeout(capsys, monkeypatch):
    import kafka

    from gangwatch.cli import kafka as kafka_cli

    made: list[dict] = []

    class FakeConsumer:
        def __init__(self, *topics: str, **kw: object) -> None:
            made.append({"topics": topics, **kw})

        def __iter__(self):
            action = {"kind": "action", "ts": 1767225666.0, "job": "sim", "type": "replace", "nodes": ["n003"],
                      "reason": "Xid 79"}
            return iter([type("Msg", (), {"value": orjson.dumps(action)})()])

        def close(self) -> None:
            pass

    monkeypatch.setattr(kafka, "KafkaConsumer", FakeConsumer)
    monkeypatch.setattr(kafka_cli, "wait_for_kafka", lambda *a: None)
    code, out, _ = run(capsys, "topics", "tail", "actions", "--from-beginning")
    assert code == 0 and out == "2026-01-01T00:01:06Z  action    sim  replace n003: Xid 79\n"
    [kw] = made
    assert kw["topics"] == ("gw.actions",) and kw["auto_offset_reset"] == "earliest"
    assert kw["consumer_timeout_ms"] == float("inf")  # kafka-python's own "never"
    assert kafka_cli.consumer_timeout_ms(2.5) == 2500


@pytest.mark.parametrize(("store", "says"), [
    ("mysql://gw@db1/gangwatch", "unknown store URL scheme 'mysql:'"),
    ("clickhouse:/127.0.0.1:9000/gangwatch", "malformed store URL"),
    ("clickhouse://127.0.0.1:99999/gangwatch", "bad port"),
    ("clickhouse://127.0.0.1:9000/gang-watch", "bad database name 'gang-watch'"),
])
@pytest.mark.parametrize("command", ["replay", "query"])
def test_a_bad_store_url_is_one_line_and_creates_nothing(capsys, monkeypatch, tmp_path, stream, store, says,
                                                         command):
    monkeypatch.chdir(tmp_path)
    argv = ["replay", str(stream), "--out", "o"] if command == "replay" else ["store", "query", "SELECT 1"]
    code, _, err = run(capsys, *argv, "--store", store, "--connect-timeout", "1")
    line = one_error(err)
    assert code == EXIT_USAGE and says in line
    assert "clickhouse[s]://" in line or "letters, digits and underscores" in line
    assert list(tmp_path.iterdir()) == []  # not even --out


def test_a_store_that_answers_http_is_named_within_seconds(capsys, monkeypatch):
    """What ClickHouse's HTTP port does with the native hello: waits for the end of a request that never comes."""
    import time

    from gangwatch.sinks import store

    port, close = _server(lambda got: b"HTTP/1.0 200 OK\r\nContent-Length: 4\r\n\r\nOk.\n"
                          if got.startswith(b"GET ") else None)
    monkeypatch.setattr(store, "HELLO_TIMEOUT_S", 1.0)
    started = time.monotonic()
    try:
        code, _, err = run(capsys, "store", "query", "SELECT 1", "--store", f"clickhouse://127.0.0.1:{port}/gw")
    finally:
        close()
    assert code == EXIT_SERVICE and "looks like the HTTP port" in one_error(err) and "9000" in one_error(err)
    assert time.monotonic() - started < 10 and len(err.splitlines()) == 1


def test_a_query_of_a_store_that_is_not_there_creates_nothing(capsys, tmp_path):
    code, _, err = run(capsys, "store", "query", "SELECT 1", "--store", f"chdb:{tmp_path / 'none'}")
    assert code == EXIT_INPUT and "no store at" in one_error(err) and not (tmp_path / "none").exists()


def test_a_query_error_shows_the_stores_message_and_floats_come_in_full(capsys, tmp_path):
    from gangwatch.sinks.store import ChdbStore

    ChdbStore(tmp_path / "store").close()
    code, _, err = run(capsys, "store", "query", "SELEC 1", "--out", str(tmp_path))
    assert code == EXIT_USAGE and "Code: 62. DB::Exception: Syntax error" in one_error(err)
    code, out, _ = run(capsys, "store", "query", "SELECT 1767225600.225973 AS ts, [0.1, 2.5] AS s", "--out",
                       str(tmp_path))
    assert code == 0 and out.splitlines()[1].split() == ["1767225600.225973", "[0.1,", "2.5]"]


def test_replay_of_a_file_with_no_valid_record_is_an_input_error(capsys, tmp_path):
    import random

    noise = tmp_path / "noise.bin"
    noise.write_bytes(random.Random(5).randbytes(50_000).replace(b"\x1f\x8b", b"xx"))
    code, _, err = run(capsys, "replay", str(noise), "--out", str(tmp_path / "o"))
    line = one_error(err)
    assert code == EXIT_INPUT and str(noise) in line and str(tmp_path / "o" / "rejected.jsonl") in line
    assert (tmp_path / "o" / "rejected.jsonl").read_bytes().count(b"\n") > 100


def test_help_names_every_topics_action_and_hints_say_gw_up(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    [topics] = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("topics")]
    assert all(word in topics for word in ("create", "list", "tail"))
    from gangwatch.cli import services

    for wait in (lambda: services.wait_for_kafka(f"127.0.0.1:{closed_port()}", 0.1),
                 lambda: services.wait_for_store(f"clickhouse://127.0.0.1:{closed_port()}/db", 0.1)):
        with pytest.raises(UserError) as e:
            wait()
        assert "(./gw up)" in str(e.value)


@pytest.mark.parametrize("argv", [["slurm", "apply", "--bootstrap", "127.0.0.1:1"],
                                  ["kubernetes", "apply", "--bootstrap", "127.0.0.1:1"],
                                  ["controller", "--bootstrap", "127.0.0.1:1", "--job", "j1", "--nodes", "n1", "--",
                                   "train.py"]])
def test_what_acts_on_the_alert_topic_needs_the_secret_its_actions_are_signed_with(capsys, monkeypatch, argv):
    """Without GANGWATCH_WEBHOOK_SECRET it would have to refuse every action: one line saying so, before any
    connection."""
    monkeypatch.delenv("GANGWATCH_WEBHOOK_SECRET", raising=False)
    assert main(argv) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "signed with the worker's secret: set GANGWATCH_WEBHOOK_SECRET" in line and "Traceback" not in line


def test_kubernetes_without_a_cluster_to_talk_to_is_one_line(capsys, monkeypatch, tmp_path):
    need_module("kubernetes", "the Kubernetes adapter (the `kubernetes` extra)")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    (tmp_path / "a.jsonl").write_text("")
    # (a dry run needs no cluster: tests/unit/test_fence_dry_run.py; acting does)
    assert main(["kubernetes", "apply", "--act", "--from", str(tmp_path / "a.jsonl")]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("gangwatch kubernetes: error: no Kubernetes API to talk to") and "--kubeconfig" in line


# --- spares ---------------------------------------------------------------------------------------


def test_spares_reads_a_gzipped_history_as_it_reads_the_plain_one(capsys, tmp_path):
    from gangwatch.fleet.history import to_csv
    from gangwatch.producers.simulate.outages import outages

    text = to_csv(outages(200, 60, seed=4, rate=0.004))
    (tmp_path / "h.csv").write_text(text)
    (tmp_path / "h.csv.gz").write_bytes(gzip.compress(text.encode()))
    plain = run(capsys, "spares", "--machines", "64", "--history", str(tmp_path / "h.csv"), "--format", "json")
    zipped = run(capsys, "spares", "--machines", "64", "--history", str(tmp_path / "h.csv.gz"), "--format", "json")
    assert plain[0] == zipped[0] == 0 and orjson.loads(plain[1]) == orjson.loads(zipped[1])


@pytest.mark.parametrize(("content", "says"), [
    (b"\x1f\x8b\x08\x00 cut short", "not a text file"),
    (b"\xff\xfe\x00binary", "not a text file"),
    (b"node,start,end,class\nm1,yesterday,,fail_stop\n", ":2: start"),
])
def test_a_spares_history_that_cannot_be_read_is_named(capsys, tmp_path, content, says):
    (tmp_path / "h.csv.gz").write_bytes(content)
    code, out, err = run(capsys, "spares", "--machines", "8", "--history", str(tmp_path / "h.csv.gz"))
    assert code == EXIT_INPUT and says in one_error(err) and str(tmp_path / "h.csv.gz") in one_error(err)
    assert out == ""


def test_spares_refuses_a_history_shorter_than_a_few_repair_windows(capsys, tmp_path):
    """The demo's four minutes, read as a daily rate, gave 'spares 2201 ... rate 261.7 failures/machine-day'."""
    (tmp_path / "h.csv").write_text("node,start,end,class\nm1,2026-01-01T00:01:08Z,,fail_slow\n"
                                    "m2,2026-01-01T00:02:31Z,,fail_stop\n")
    code, out, err = run(capsys, "spares", "--machines", "8", "--history", str(tmp_path / "h.csv"))
    line = one_error(err)
    assert code == EXIT_INPUT and out == "" and str(tmp_path / "h.csv") in line
    assert "2 failures from 2026-01-01T00:01:08Z to 2026-01-01T00:02:31Z, 0.00 days" in line
    assert "at least 3 repair windows (3 x --repair-hours 24 = 3 days)" in line
    # the same two failures, 83 s apart, pass a shorter repair window's test (18 s: 54 s needed)
    code, _, err = run(capsys, "spares", "--machines", "8", "--history", str(tmp_path / "h.csv"),
                       "--repair-hours", "0.005")
    assert "repair windows" not in err


@pytest.mark.parametrize("sql", ["DROP TABLE gw_rejected", "INSERT INTO gw_rejected SELECT * FROM gw_rejected",
                                 "SET readonly = 0", "CREATE TABLE x (a UInt8) ENGINE = Memory"])
def test_store_query_only_reads_on_chdb(capsys, tmp_path, sql):
    from gangwatch.sinks.store import ChdbStore

    store = ChdbStore(tmp_path / "store")
    store.create_tables()
    store.close()
    code, out, err = run(capsys, "store", "query", sql, "--out", str(tmp_path))
    line = one_error(err)
    assert code == EXIT_USAGE and out == "" and "Code: 164" in line
    assert "refused: queries here only read (the store is opened read-only), so nothing was changed" in line
    code, out, _ = run(capsys, "store", "query", "SELECT name FROM system.tables WHERE database = currentDatabase() "
                       "AND name IN ('gw_rejected', 'x')", "--out", str(tmp_path), "--format", "jsonl")
    assert code == 0 and out.split() == ['{"name":"gw_rejected"}']


def test_replay_of_an_empty_file_is_an_input_error(capsys, tmp_path, stream):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    code, _, err = run(capsys, "replay", str(tmp_path / "empty.jsonl"), "--out", str(tmp_path / "o"), "-q")
    assert code == EXIT_INPUT and f"{tmp_path / 'empty.jsonl'} is empty: not one record" in one_error(err)
    code, _, err = run(capsys, "replay", str(tmp_path / "empty.jsonl"), str(stream), "--out", str(tmp_path / "o"),
                       "-q", "--no-store")
    assert code == EXIT_INPUT and "empty.jsonl is empty" in one_error(err)  # named beside a good file too


# --- Ctrl-C -----------------------------------------------------------------------------------------


def test_ctrl_c_during_a_replay_says_what_was_read_and_marks_the_outputs_partial(capsys, monkeypatch, tmp_path):
    """Ctrl-C lands after the first chunk the replay fed (its first progress report): the outputs hold what was
    found so far and say they are partial, the summary and one line say how far it got, exit 130."""
    from gangwatch.producers.simulate import Fault, Scenario, write

    from gangwatch.cli import console

    sc = Scenario("ctrlc", seed=5, tp=4, pp=1, dp=4, gpus_per_node=4, duration_s=600.0,
                  faults=(Fault("xid79", at_s=400.0, node="n001", params={"gpu": 1}),))
    path, _ = write(sc, tmp_path / "sim")

    class CtrlC(console.ProgressLine):
        def __call__(self, s, fraction: float) -> None:
            raise KeyboardInterrupt

    monkeypatch.setattr(console, "ProgressLine", CtrlC)
    out = tmp_path / "o"
    code, stdout, err = run(capsys, "replay", str(path), "--out", str(out), "--progress")
    line = one_error(err)
    assert code == 130 and "interrupted (Ctrl-C) after 4,096 records" in line and "up to event time 20" in line
    assert f"the outputs in {out} are partial (marked by {out / 'PARTIAL'})" in line
    assert "replayed  4,096 records" in stdout
    marker = (out / "PARTIAL").read_text()
    assert "interrupted (Ctrl-C) after 4,096 records" in marker and "Replay again" in marker
    assert (out / "findings.jsonl").exists() and not (out / "actions.jsonl").read_bytes()  # the fault was not reached
    monkeypatch.undo()
    assert run(capsys, "replay", str(path), "--out", str(out), "-q")[0] == 0  # a whole replay: no longer partial
    assert not (out / "PARTIAL").exists() and (out / "actions.jsonl").read_bytes()


# --- searches that find nothing say why ---------------------------------------------------------------


@pytest.fixture(scope="module")
def open_only(tmp_path_factory, stream) -> Path:
    """A replay's output folder whose store holds one incident, still open, and actions taken for real."""
    out = tmp_path_factory.mktemp("open-only")
    assert main(["replay", str(stream), "--out", str(out), "-q"]) == 0
    return out


def test_kb_search_of_a_store_of_only_open_incidents_says_why_nothing_is_found(capsys, open_only):
    code, out, _ = run(capsys, "store", "query", "SELECT count() AS n FROM gw_incidents FINAL WHERE recovered_ts "
                       "IS NULL", "--out", str(open_only), "--format", "jsonl")
    assert code == 0 and orjson.loads(out)["n"] >= 1
    code, out, _ = run(capsys, "kb", "search", "--out", str(open_only))
    assert code == 0 and out.startswith("(no rows: none of the store's ") and "is closed yet" in out
    assert "`gangwatch sql open_incidents` lists the open ones" in out
    code, out, err = run(capsys, "kb", "search", "--out", str(open_only), "--format", "json")
    assert code == 0 and orjson.loads(out) == [] and "is closed yet" in err


def test_store_shadow_without_shadow_mode_says_it_was_off(capsys, open_only):
    code, out, _ = run(capsys, "store", "shadow", "--out", str(open_only))
    assert code == 0 and out.startswith("(no rows: shadow mode was off: no would-be action is stored (")
    assert "--set triage.shadow=true" in out


def test_the_replay_summary_says_what_each_kind_of_finding_it_counts_is():
    """Issue 47: the demo's summary counted 23 `stack_outlier` findings after the Xid with no word of what they
    are. Each count now carries its type's meaning, from the docstring of the evidence it carries."""
    from gangwatch.cli.console import meaning

    assert meaning("stack_outlier").startswith("A rank whose call path belongs to a small cluster")
    assert meaning("silent_end").startswith("The job's life as its silence tells it")
    cut = meaning("telemetry_gap", width=40)
    assert len(cut) <= 40 and cut.endswith("...") and meaning("no_such_type") == ""
