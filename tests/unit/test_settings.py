"""The settings object (`gangwatch.settings`): flags > GANGWATCH_* variables > TOML file > defaults, derived from
the runtime dataclasses, reaching the detectors, and shown (masked) by `gangwatch config show`."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from gangwatch import settings as S
from gangwatch.cli import build_parser, main
from gangwatch.cli.options import EXIT_INPUT, EXIT_USAGE, resolve

pytestmark = pytest.mark.unit

GW = [sys.executable, "-m", "gangwatch"]


def toml(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "gangwatch.toml"
    p.write_text(text)
    return p


def gangwatch(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GANGWATCH_")}
    return subprocess.run([*GW, *argv], capture_output=True, text=True, env={**clean, **(env or {})}, timeout=120)


# --- one source of defaults -----------------------------------------------------------------------------


def test_every_field_of_the_runtime_dataclasses_is_a_setting_with_its_default():
    from gangwatch.detectors.monitor import detector_configs
    from gangwatch.schemas.topics import TopicSettings
    from gangwatch.streams.worker_settings import WorkerSettings
    from gangwatch.triage.budgets import TriageConfig

    values = {r.setting: r.value for r in S.load(environ={}).rows()}

    def expect(prefix: str, obj, skip=()) -> None:
        for f in dataclasses.fields(obj):
            if f.name in skip:
                continue
            v = getattr(obj, f.name)
            if dataclasses.is_dataclass(v):
                expect(f"{prefix}.{f.name}", v)
            else:
                assert values.pop(f"{prefix}.{f.name}") == v, f"{prefix}.{f.name}"

    ws = WorkerSettings()
    sinks = {f.name for f in dataclasses.fields(ws) if f.name in S.SINK_FIELDS}
    expect("worker", ws, skip={"topics", "core", "lateness_s", *sinks})
    for name in sinks:
        assert values.pop(f"sinks.{name}") == getattr(ws, name)
    expect("topics", TopicSettings(), skip={"app"})  # the worker's app id, not a setting of its own
    expect("triage", TriageConfig())
    for name, kind in detector_configs().items():
        expect(f"detectors.{name}", kind())
    from gangwatch.schemas.security import KafkaSecurity

    expect("kafka_security", KafkaSecurity())
    assert values.pop("core.lateness_s") == ws.lateness_s
    assert set(values) == {"core.tick_s"}  # nothing else: no setting restated by hand
    assert set(detector_configs()) >= {"failstop", "hang", "failslow", "sdc", "stacks", "flight", "hardware",
                                       "linkerrors", "comm", "slowdown"}


def test_default_settings_build_the_default_runtime_objects():
    from gangwatch.schemas.topics import TopicSettings
    from gangwatch.triage.budgets import CoreConfig, TriageConfig

    loaded = S.load(environ={})
    core = loaded.core_config()
    assert core.triage == TriageConfig() and (core.lateness_s, core.tick_s) == (CoreConfig().lateness_s,
                                                                                 CoreConfig().tick_s)
    assert all(cfg == type(cfg)() for cfg in core.detectors.values())
    assert loaded.topic_settings() == TopicSettings()
    ws = loaded.worker_settings()
    assert ws.batch_max == 20_000 and ws.core == core and ws.topics == TopicSettings()


def test_each_app_id_reads_its_own_re_keyed_node_events_and_shares_the_rest():
    """Workers of another --app-id never read this app's node events re-keyed by job (issue 24: a second app id
    read the first's re-keyed GPU samples as well as its own)."""
    from gangwatch.schemas.topics import TopicSettings
    from gangwatch.streams.runner import JobRunner
    from gangwatch.streams.worker_settings import WorkerSettings

    a, b = WorkerSettings(app_id="a").own_topics, WorkerSettings(app_id="b").own_topics
    assert (a.by_job, b.by_job) == ("gw.a.by-job", "gw.b.by-job")
    assert (a.inputs, a.outputs, a.node_jobs) == (b.inputs, b.outputs, b.node_jobs)  # the inputs and the map: shared
    assert a.by_job in JobRunner(a).inputs and b.by_job not in JobRunner(a).inputs
    assert a.by_job in a.all() and TopicSettings().internal == ("gw.node-jobs",)  # `topics create` w/o an app


def test_help_shows_the_default_of_the_dataclass(capsys):
    from gangwatch.streams.worker_settings import WorkerSettings

    with pytest.raises(SystemExit):
        main(["worker", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"GANGWATCH_WORKER__BATCH_MAX or GANGWATCH_BATCH_MAX; default {WorkerSettings().batch_max})" in text
    assert "env GANGWATCH_CORE__LATENESS_S or GANGWATCH_LATENESS; default 1.0" in text


# --- sources and precedence ---------------------------------------------------------------------------------


def test_precedence_flag_over_env_over_toml_over_default(tmp_path):
    cfg = toml(tmp_path, "[worker]\nbatch_max = 100\nhold_s = 7\napp_id = 'from-toml'\n[triage]\nspares = 3\n")
    env = {"GANGWATCH_WORKER__BATCH_MAX": "200", "GANGWATCH_WORKER__HOLD_S": "8", "GANGWATCH_CONFIG": str(cfg)}
    loaded = S.load({"worker.batch_max": (300, "--batch-max")}, env)
    assert loaded.get("worker.batch_max") == 300 and str(loaded.origin("worker.batch_max")) == "flag --batch-max"
    assert loaded.get("worker.hold_s") == 8.0 and loaded.source("worker.hold_s") == "env"
    assert loaded.get("worker.app_id") == "from-toml" and loaded.source("worker.app_id") == "toml"
    assert loaded.get("triage.spares") == 3 and loaded.source("triage.spares") == "toml"
    assert loaded.get("worker.tick_s") == 0.5 and loaded.source("worker.tick_s") == "default"
    # one layer less each time: the next one shows through
    assert S.load({}, env).get("worker.batch_max") == 200
    assert S.load({}, {"GANGWATCH_CONFIG": str(cfg)}).get("worker.batch_max") == 100
    assert S.load({}, {}).get("worker.batch_max") == 20_000


def test_nested_variables_reach_every_section():
    env = {"GANGWATCH_WORKER__BATCH_MAX": "5000", "GANGWATCH_DETECTORS__HANG__MIN_STALL_S": "33.5",
           "GANGWATCH_TRIAGE__BUDGETS__DETECT": "12", "GANGWATCH_TRIAGE__SAFETY__MAX_EVICT_NODES": "2",
           "GANGWATCH_DETECTORS__FAILSLOW__BUFFER__LAG": "4", "gangwatch_topics__prefix": "prod.",
           "GANGWATCH_TRIAGE__SPARES": "none", "GANGWATCH_SINKS__WEBHOOK": "http://ctl:8080/hook"}
    loaded = S.load({}, env)
    core = loaded.core_config()
    assert core.detectors["hang"].min_stall_s == 33.5
    assert core.detectors["failslow"].buffer.lag == 4
    assert core.triage.budgets.detect == 12.0 and core.triage.safety.max_evict_nodes == 2
    assert core.triage.spares is None
    ws = loaded.worker_settings()
    assert ws.batch_max == 5000 and ws.topics.prefix == "prod." and ws.webhook == "http://ctl:8080/hook"
    assert str(loaded.origin("triage.budgets.detect")) == "env GANGWATCH_TRIAGE__BUDGETS__DETECT"


def test_the_older_flat_variables_still_work_below_the_nested_ones():
    loaded = S.load({}, {"GANGWATCH_BATCH_MAX": "9", "GANGWATCH_TOPIC_PREFIX": "old."})
    assert loaded.get("worker.batch_max") == 9 and str(loaded.origin("worker.batch_max")) == "env GANGWATCH_BATCH_MAX"
    assert loaded.get("topics.prefix") == "old."
    both = S.load({}, {"GANGWATCH_BATCH_MAX": "9", "GANGWATCH_WORKER__BATCH_MAX": "10"})
    assert both.get("worker.batch_max") == 10
    from gangwatch.schemas.topics import TopicSettings  # what `topics`, `publish` and the controller read

    assert TopicSettings.from_env({"GANGWATCH_TOPICS__PREFIX": "n.", "GANGWATCH_TOPIC_PREFIX": "o."}).prefix == "n."


def test_cli_flags_and_set_win_and_fill_the_options(tmp_path):
    cfg = toml(tmp_path, "[worker]\nbatch_max = 100\n[detectors.hang]\nmin_stall_s = 40\n")
    args = build_parser().parse_args(["worker", "--config", str(cfg), "--set", "detectors.hang.min_stall_s=50",
                                      "--tick", "2"])
    resolve(args, {"GANGWATCH_DETECTORS__HANG__MIN_STALL_S": "45", "GANGWATCH_WORKER__TICK_S": "3"})
    st = args.settings
    assert args.batch_max == 100 and st.source("worker.batch_max") == "toml"
    assert args.tick == 2.0 and str(st.origin("worker.tick_s")) == "flag --tick"
    assert st.core_config().detectors["hang"].min_stall_s == 50.0
    assert str(st.origin("detectors.hang.min_stall_s")) == "flag --set detectors.hang.min_stall_s"


def test_a_toml_file_with_every_kind_of_value(tmp_path):
    cfg = toml(tmp_path, """
[worker]
bootstrap = "kafka1:9092,kafka2:9092"
silence = false
[topics]
partitions = 16
[triage]
spares = 4
[triage.safety]
max_evict_frac = 0.1
[detectors.failstop]
miss_factor = 4
""")
    loaded = S.load({}, {}, cfg)
    ws = loaded.worker_settings()
    assert ws.bootstrap == "kafka1:9092,kafka2:9092" and ws.silence is False and ws.topics.partitions == 16
    assert ws.core.triage.spares == 4 and ws.core.triage.safety.max_evict_frac == 0.1
    assert ws.core.detectors["failstop"].miss_factor == 4.0


# --- errors -------------------------------------------------------------------------------------------------


def test_unknown_keys_in_the_toml_file_are_named(tmp_path):
    cfg = toml(tmp_path, "[worker]\nbatch_mx = 1\n[detectors.hang]\nmin_stal_s = 3\n[detectorz]\nx = 1\n")
    with pytest.raises(S.SettingsError) as e:
        S.load({}, {}, cfg)
    msg = str(e.value)
    assert e.value.code == EXIT_INPUT and "\n" not in msg
    for key in ("worker.batch_mx", "detectors.hang.min_stal_s", "detectorz"):
        assert key in msg


@pytest.mark.parametrize(("env", "want"), [
    ({"GANGWATCH_DETECTORS__HANG__MIN_STALL_S": "abc"},
     "detectors.hang.min_stall_s (from env GANGWATCH_DETECTORS__HANG__MIN_STALL_S): expected a number, got 'abc'"),
    ({"GANGWATCH_WORKER__BATCH_MAX": "1.5"},
     "worker.batch_max (from env GANGWATCH_WORKER__BATCH_MAX): expected an integer, got '1.5'"),
    ({"GANGWATCH_WORKER__SILENCE": "maybe"}, "worker.silence (from env GANGWATCH_WORKER__SILENCE): expected a boolean"),
    ({"GANGWATCH_TRIAGE__BUDGETS__DETCT": "5"}, "unknown setting triage.budgets.detct"),
])
def test_a_bad_variable_is_one_line_naming_the_setting(env, want):
    with pytest.raises(S.SettingsError) as e:
        S.load({}, env)
    assert want in str(e.value) and "\n" not in str(e.value) and e.value.code == EXIT_USAGE


def test_a_bad_value_through_the_command_line_is_one_line_without_traceback(tmp_path):
    bad = gangwatch("config", "show", env={"GANGWATCH_DETECTORS__HANG__MIN_STALL_S": "abc"})
    assert bad.returncode == EXIT_USAGE, bad.stderr
    assert bad.stderr.strip() == ("gangwatch config: error: detectors.hang.min_stall_s (from env "
                                  "GANGWATCH_DETECTORS__HANG__MIN_STALL_S): expected a number, got 'abc'")
    assert bad.stdout == ""
    cfg = toml(tmp_path, "[detectors.hang]\nmin_stall = 3\n")
    typo = gangwatch("replay", str(tmp_path / "x.jsonl"), "--config", str(cfg))
    assert typo.returncode == EXIT_INPUT and "Traceback" not in typo.stderr
    assert len(typo.stderr.strip().splitlines()) == 1 and "detectors.hang.min_stall" in typo.stderr
    missing = gangwatch("config", "show", "--config", str(tmp_path / "nope.toml"))
    assert missing.returncode == EXIT_INPUT and "no such config file" in missing.stderr
    neg = gangwatch("worker", "--set", "worker.batch_max=0")
    assert neg.returncode == EXIT_USAGE and "Traceback" not in neg.stderr
    assert "worker.batch_max (from flag --set worker.batch_max): must be greater than 0" in neg.stderr


# --- the thresholds reach the detectors ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def hang_stream(tmp_path_factory) -> Path:
    from gangwatch.producers.simulate import Fault, Scenario, write

    sc = Scenario("hang", seed=3, tp=2, pp=2, dp=2, gpus_per_node=4, duration_s=120.0,
                  faults=(Fault("dataloader_hang", at_s=50.0, rank=5),))
    return write(sc, tmp_path_factory.mktemp("sim"))[0]


def hangs(out: Path) -> list[dict]:
    rows = [orjson.loads(line) for line in (out / "findings.jsonl").read_bytes().splitlines()]
    return [f for f in rows if f["type"] == "hang"]


def test_a_hang_threshold_from_the_environment_changes_when_the_hang_fires(hang_stream, tmp_path, monkeypatch):
    for k in [k for k in os.environ if k.startswith("GANGWATCH_")]:
        monkeypatch.delenv(k)
    assert main(["replay", str(hang_stream), "--out", str(tmp_path / "d"), "--no-store", "-q"]) == 0
    (default,) = hangs(tmp_path / "d")
    assert default["evidence"]["threshold_s"] == 20.0
    monkeypatch.setenv("GANGWATCH_DETECTORS__HANG__MIN_STALL_S", "45")
    assert main(["replay", str(hang_stream), "--out", str(tmp_path / "e"), "--no-store", "-q"]) == 0
    (later,) = hangs(tmp_path / "e")
    assert later["evidence"]["threshold_s"] == 45.0 and later["ts"] == pytest.approx(default["ts"] + 25.0)
    monkeypatch.setenv("GANGWATCH_DETECTORS__HANG__MIN_STALL_S", "500")  # longer than the rest of the run
    assert main(["replay", str(hang_stream), "--out", str(tmp_path / "f"), "--no-store", "-q"]) == 0
    assert hangs(tmp_path / "f") == []


def test_a_failstop_miss_factor_reaches_the_detector_of_a_job():
    from gangwatch.detectors.config import FailStopConfig
    from gangwatch.schemas import Heartbeat, Job, RankInfo
    from gangwatch.triage.core import JobCore

    def silent_after(miss_factor: float | None) -> list[float]:
        env = {} if miss_factor is None else {"GANGWATCH_DETECTORS__FAILSTOP__MISS_FACTOR": str(miss_factor)}
        core = JobCore(job, S.load({}, env).core_config())
        assert isinstance(core.monitor.configs["failstop"], FailStopConfig)
        fired = []
        for t in range(0, 60):
            for r in range(4):
                if r >= 2 and t >= 10:
                    continue  # node n1 (ranks 2, 3) falls silent at t=10
                out = core.process(Heartbeat(ts=t0 + t, job="j", rank=r, step=t))  # past start-up
                fired += [f.ts - t0 for f in out.findings if f.type == "fail_stop"]
        return fired

    t0 = 1_700_000_000.0
    ranks = [RankInfo(rank=r, node=f"n{r // 2}", gpu=r % 2) for r in range(4)]
    job = Job(ts=t0, job="j", ranks=ranks, heartbeat_s=1.0)
    default, slow = silent_after(None), silent_after(10.0)
    assert default and slow and slow[0] > default[0] + 5


def test_a_restored_job_runs_with_todays_settings_not_the_saved_ones():
    from gangwatch.detectors.config import HangConfig
    from gangwatch.schemas import Job, RankInfo, Step
    from gangwatch.triage.budgets import CoreConfig
    from gangwatch.triage.core import JobCore

    t0 = 1_700_000_000.0
    job = Job(ts=t0, job="j", ranks=[RankInfo(rank=r, node="n0", gpu=r) for r in range(2)])
    old = JobCore(job, CoreConfig(detectors={"hang": HangConfig(min_stall_s=99.0)}))
    for s in range(3):
        for r in range(2):
            old.process(Step(ts=t0 + s, job="j", rank=r, step=s, step_s=1.0))
    state = orjson.loads(orjson.dumps(old.state()))
    new = JobCore.from_state(state, CoreConfig(detectors={"hang": HangConfig(min_stall_s=7.0)}))
    hang = next(d for d in new.monitor.detectors if d.name == "hang")
    assert hang.config.min_stall_s == 7.0
    plain = JobCore.from_state(state, CoreConfig())
    assert next(d for d in plain.monitor.detectors if d.name == "hang").config == HangConfig()
    with pytest.raises(ValueError, match="no detector named hangg"):
        JobCore(job, CoreConfig(detectors={"hangg": HangConfig()}))


# --- config show ----------------------------------------------------------------------------------------------


def test_config_show_lists_every_setting_with_its_source_and_masks_secrets(tmp_path):
    cfg = toml(tmp_path, "[worker]\nbatch_max = 100\n")
    env = {"GANGWATCH_WEBHOOK_SECRET": "hunter2-secret", "GANGWATCH_SINKS__STORE": "clickhouse://gw:pa55@ch1:9000/db",
           "GANGWATCH_DETECTORS__HANG__MIN_STALL_S": "30"}
    shown = gangwatch("config", "show", "--config", str(cfg), "--set", "triage.spares=2", env=env)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "hunter2" not in text and "pa55" not in text
    lines = {ln.split()[0]: ln for ln in text.splitlines()}
    assert lines["sinks.webhook_secret"].split()[1] == '"***"' and "(env GANGWATCH_WEBHOOK_SECRET)" in text
    assert '"clickhouse://***@ch1:9000/db"' in lines["sinks.store"]
    assert lines["worker.batch_max"].endswith(f"(toml {cfg})") and " 100 " in lines["worker.batch_max"]
    assert lines["detectors.hang.min_stall_s"].endswith("(env GANGWATCH_DETECTORS__HANG__MIN_STALL_S)")
    assert lines["triage.spares"].endswith("(flag --set triage.spares)")
    assert lines["worker.tick_s"].endswith("(default)")
    assert len(lines) == len(S.load(environ={}).rows())
    doc = json.loads(gangwatch("config", "show", "--json", env=env).stdout)
    assert doc["sinks.webhook_secret"]["value"] == "***" and doc["sinks.webhook_secret"]["source"] == "env"
    assert doc["detectors.hang.min_stall_s"] == {"value": 30.0, "source": "env",
                                                 "from": "GANGWATCH_DETECTORS__HANG__MIN_STALL_S",
                                                 "env": "GANGWATCH_DETECTORS__HANG__MIN_STALL_S"}
    assert doc["worker.batch_max"]["source"] == "default"


@pytest.mark.parametrize(("path", "value", "shown"), [
    ("sinks.webhook_secret", "x", "***"), ("a.password", "x", "***"), ("a.api_token", "x", "***"),
    ("sinks.store", "clickhouse://u:p@h:9000/db", "clickhouse://***@h:9000/db"),
    ("sinks.webhook", "https://tok@ctl/hook", "https://***@ctl/hook"),
    ("sinks.webhook", "https://ctl/hook", "https://ctl/hook"), ("sinks.webhook_secret", None, None),
])
def test_masking(path, value, shown):
    assert S.masked(path, value) == shown


def test_help_stays_fast_without_pydantic():
    code = "import sys; from gangwatch.cli import build_parser; build_parser(); print(sorted(m for m in sys.modules " \
           "if m.split('.')[0] in ('pydantic', 'pydantic_settings', 'numpy', 'faust')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_example_file_in_the_docs_loads_and_means_what_it_says(tmp_path):
    import re

    page = (Path(__file__).parents[2] / "docs" / "settings.md").read_text()
    (example,) = re.findall(r"```toml\n(.*?)```", page, re.S)
    st = S.load({}, {}, toml(tmp_path, example))
    ws = st.worker_settings()
    assert ws.core.detectors["hang"].min_stall_s == 45.0 and ws.core.detectors["failstop"].miss_factor == 3.0
    assert ws.topics.prefix == "prod." and ws.batch_max == 5000 and ws.core.triage.spares == 4
    assert st.source("triage.budgets.detect") == "toml" and st.source("worker.tick_s") == "default"


def test_the_worker_runs_with_the_settings_of_flags_variables_and_file(monkeypatch, tmp_path):
    from gangwatch.streams import worker

    from gangwatch.cli import kafka

    ran = []
    monkeypatch.setattr(kafka, "wait_for_kafka", lambda *a: None)
    monkeypatch.setattr(worker, "run", lambda s, **kw: ran.append(s))
    for k in [k for k in os.environ if k.startswith("GANGWATCH_")]:
        monkeypatch.delenv(k)
    cfg = toml(tmp_path, "[worker]\nsession_timeout_s = 45\n[triage.safety]\nmax_evict_nodes = 3\n")
    monkeypatch.setenv("GANGWATCH_DETECTORS__HANG__MIN_STALL_S", "30")
    monkeypatch.setenv("GANGWATCH_TOPICS__PREFIX", "prod.")
    assert main(["worker", "--config", str(cfg), "--batch-max", "7", "--lateness", "2.5", "--no-silence"]) == 0
    (s,) = ran
    assert (s.batch_max, s.silence, s.lateness_s, s.topics.prefix) == (7, False, 2.5, "prod.")
    assert s.session_timeout_s == 45.0 and s.request_timeout_s == 55.0  # not given: session + 10
    assert s.core.detectors["hang"].min_stall_s == 30.0 and s.core.triage.safety.max_evict_nodes == 3
    assert s.core.lateness_s == 2.5 and s.web is False and s.metrics_port == 9464
    assert main(["worker", "--web-port", "8080", "--request-timeout", "50"]) == 0
    assert (ran[-1].web, ran[-1].web_port, ran[-1].request_timeout_s) == (True, 8080, 50.0)


# --- the Kafka clients' security ---------------------------------------------------------------------------


def test_kafka_sasl_from_a_toml_file_reaches_the_clients_and_its_password_no_screen(tmp_path):
    """SASL/SSL of every Kafka client in the settings too: from TOML (or a flag) it is put where the clients read
    it, GANGWATCH_KAFKA_* (the environment's own win, as for every setting); `config show` masks the password."""
    from gangwatch.schemas.security import KafkaSecurity

    cfg = toml(tmp_path, "[kafka_security]\nsecurity_protocol = 'SASL_SSL'\nsasl_mechanism = 'SCRAM-SHA-512'\n"
                         "username = 'gw'\npassword = 'hunter2-very-secret'\n")
    environ: dict[str, str] = {"GANGWATCH_KAFKA_SSL_CHECK_HOSTNAME": "0"}
    loaded = S.load({}, environ, cfg)
    loaded.export_kafka(environ)
    sec = KafkaSecurity.from_env(environ)
    assert (sec.security_protocol, sec.sasl_mechanism, sec.username, sec.password) == (
        "SASL_SSL", "SCRAM-SHA-512", "gw", "hunter2-very-secret")
    assert sec.ssl_check_hostname is False and loaded.source("kafka_security.ssl_check_hostname") == "env"
    assert sec.kafka_python()["sasl_plain_username"] == "gw"
    shown = gangwatch("config", "show", "--config", str(cfg))
    assert shown.returncode == 0 and "hunter2" not in shown.stdout + shown.stderr
    assert any(line.startswith("kafka_security.password") and "***" in line for line in shown.stdout.splitlines())


def test_kafka_settings_that_do_not_fit_together_are_one_line():
    bad = gangwatch("config", "show", env={"GANGWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                                           "GANGWATCH_KAFKA_USERNAME": "gw"})
    assert bad.returncode == EXIT_USAGE and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == [
        "gangwatch config: error: kafka_security: SASL_PLAINTEXT needs GANGWATCH_KAFKA_USERNAME and "
        "GANGWATCH_KAFKA_PASSWORD"]
