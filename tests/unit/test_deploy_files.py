"""The deployment examples in deploy/compose and deploy/systemd parse, and name only commands that exist.

Containers and systemd cannot run here, so each file is checked by parsing it:
the compose file and the Prometheus / Alertmanager configs with PyYAML, the
unit files with configparser. Every `gangwatch` command line in them must name
a real subcommand, only options its `--help` lists, and only GANGWATCH_*
variables that command (or a sink it builds) reads. Where `amtool` is installed
the Alertmanager config is also checked by Alertmanager's own parser.
"""

from __future__ import annotations

import argparse
import configparser
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.helpers import need_module, subparser

yaml = need_module("yaml", "PyYAML (the `dev` extra)")

from gangwatch.schemas.signature import SECRET_ENV  # noqa: E402
from gangwatch.sinks.alertmanager import REPORT_URL_ENV  # noqa: E402 - after the skip

pytestmark = pytest.mark.unit

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE = DEPLOY / "compose" / "docker-compose.yml"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
READ_BY_SINKS = {REPORT_URL_ENV, SECRET_ENV}  # variables a sink reads itself, not an option


def check_command(argv: list[str], env: dict[str, str], where: str) -> None:
    """`argv` (after `gangwatch`) names a command, options of its help, and variables it reads."""
    words = []
    rest = list(argv)
    while rest and not rest[0].startswith("-"):
        words.append(rest.pop(0))
        p = subparser(words)
        if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions):
            break
    p = subparser(words)
    help_text = p.format_help()
    for arg in rest:
        if arg.startswith("--"):
            flag = arg.split("=", 1)[0]
            assert f"{flag} " in help_text or f"{flag}\n" in help_text or f"{flag}," in help_text, \
                f"{where}: `gangwatch {' '.join(words)} --help` has no {flag}"
    reads = {spec.env for spec in p.get_default("_env_options") or () if spec.env} | READ_BY_SINKS
    for name in env:
        if name.startswith("GANGWATCH_"):
            assert name in reads, f"{where}: `gangwatch {' '.join(words)}` reads no {name}"
    p.parse_args([a for a in rest])  # the whole line parses (argparse exits on a bad value)


def test_compose_file_has_the_services_and_valid_gangwatch_commands():
    spec = yaml.safe_load(COMPOSE.read_text())
    services = spec["services"]
    assert set(services) >= {"kafka", "clickhouse", "worker", "agent", "prometheus", "alertmanager"}
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["clickhouse"]["image"].startswith("clickhouse/clickhouse-server:")
    build = services["worker"]["build"]
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == COMPOSE.parent / "Dockerfile"
    for name in ("worker", "agent"):
        svc = services[name]
        assert svc["image"] == services["worker"]["image"]
        check_command(list(svc["command"]), svc.get("environment") or {}, f"compose service {name}")
        for dep in svc.get("depends_on", {}):
            assert dep in services
    for name, svc in services.items():
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0]
            if source.startswith("./"):
                assert (COMPOSE.parent / source).is_file(), f"{name} mounts missing {source}"
            elif not source.startswith(("/", "$")):
                assert source in spec["volumes"], f"{name} uses undeclared volume {source}"
    worker = " ".join(services["worker"]["command"])
    assert "--alertmanager=http://alertmanager:9093" in worker and "kafka:9092" in worker


def test_dockerfile_copies_every_installed_package_folder():
    text = (COMPOSE.parent / "Dockerfile").read_text()
    ignore = (COMPOSE.parent / "Dockerfile.dockerignore").read_text()
    dirs = tomllib.loads((COMPOSE.parents[2] / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert {"control", "fleet"} <= set(dirs.values())
    for folder in sorted(set(dirs.values())):  # every folder pyproject installs, or `pip install .` fails
        assert f"COPY {folder} ./{folder}" in text and f"!{folder}/" in ignore
    assert 'ENTRYPOINT ["gangwatch"]' in text


def test_prometheus_and_alertmanager_configs():
    prom = yaml.safe_load((COMPOSE.parent / "prometheus.yml").read_text())
    [am] = prom["alerting"]["alertmanagers"]
    assert am["static_configs"][0]["targets"] == ["alertmanager:9093"]
    conf = COMPOSE.parent / "alertmanager.yml"
    route = yaml.safe_load(conf.read_text())["route"]
    assert route["group_by"] == ["job"]
    amtool = shutil.which("amtool")
    if amtool:
        out = subprocess.run([amtool, "check-config", str(conf)], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_systemd_units_parse_and_run_real_commands(unit):
    assert {u.name for u in UNITS} >= {"gangwatch-agent.service", "gangwatch-worker.service"}
    cp = configparser.ConfigParser(strict=False, interpolation=None)  # systemd repeats keys (Environment=)
    cp.optionxform = str
    cp.read_string(unit.read_text())
    assert set(cp.sections()) == {"Unit", "Service", "Install"}
    svc = cp["Service"]
    argv = shlex.split(svc["ExecStart"])
    assert argv[0].endswith("/gangwatch"), argv[0]
    env: dict[str, str] = {}
    for line in unit.read_text().splitlines():  # configparser keeps only the last of repeated keys
        if line.startswith("Environment="):
            name, _, value = line[len("Environment="):].partition("=")
            env[name] = value
    check_command(argv[1:], env, unit.name)
    assert cp["Install"]["WantedBy"] == "multi-user.target"
    assert svc["Restart"] in ("always", "on-failure")


def test_the_agent_unit_runs_without_root_with_only_the_capabilities_its_readers_need():
    """Not root: a system user; CAP_SYSLOG (/dev/kmsg under dmesg_restrict) and CAP_SYS_PTRACE (py-spy) alone,
    ambient so py-spy inherits them, the bounding set cut to the same two, no way to gain more."""
    [unit] = [u for u in UNITS if u.name == "gangwatch-agent.service"]
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str
    cp.read_string(unit.read_text())
    svc = cp["Service"]
    assert svc["User"] not in ("root", "0") and svc.get("DynamicUser", "no") == "no"
    caps = {"CAP_SYSLOG", "CAP_SYS_PTRACE"}
    assert set(svc["AmbientCapabilities"].split()) == caps and set(svc["CapabilityBoundingSet"].split()) == caps
    assert svc["NoNewPrivileges"] == "yes"
    assert f"useradd --system --no-create-home --shell /usr/sbin/nologin {svc['User']}" in unit.read_text()


def test_the_alert_consumer_doc_and_the_shipped_alertmanager_config_agree():
    """docs/alert-consumer.md's route is the shipped one, and names only receivers the shipped file defines."""
    import re

    doc = (DEPLOY.parent / "docs" / "alert-consumer.md").read_text()
    [block] = re.findall(r"```yaml\n(.*?)```", doc, re.S)
    shown = yaml.safe_load(block)
    shipped = yaml.safe_load((COMPOSE.parent / "alertmanager.yml").read_text())

    def receivers(route: dict) -> set[str]:
        return {route["receiver"], *(r for sub in route.get("routes", []) for r in receivers(sub))}

    defined = {r["name"] for r in shipped["receivers"]}
    assert receivers(shown["route"]) <= defined and receivers(shipped["route"]) <= defined
    assert {r["name"] for r in shown["receivers"]} == defined
    assert receivers(shown["route"]) == receivers(shipped["route"])
    assert shown["inhibit_rules"] == shipped["inhibit_rules"]


def test_the_compose_stack_publishes_no_port_that_gw_up_gives_kafka():
    """Alertmanager's and Kafka's host ports stay clear of `./gw up`'s Kafka (listener and KRaft controller), and the
    alert consumer's doc points at the port the stack publishes."""
    import re

    broker = (DEPLOY / "kafka" / "broker.sh").read_text()
    dev_ports = {re.search(rf'{var}:-(\d+)', broker).group(1)
                 for var in ("GANGWATCH_KAFKA_PORT", "GANGWATCH_KAFKA_CONTROLLER_PORT")}
    assert dev_ports == {"9092", "9093"}
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    for name in ("kafka", "alertmanager"):
        for mapping in services[name]["ports"]:
            host_port = mapping.split(":")[-2]
            assert host_port not in dev_ports, f"compose {name} publishes {host_port}, which ./gw up's Kafka takes"
    [am] = services["alertmanager"]["ports"]
    doc = (DEPLOY.parent / "docs" / "alert-consumer.md").read_text()
    assert f"http://127.0.0.1:{am.split(':')[-2]}" in doc
    assert not re.search(r"(127\.0\.0\.1|localhost):9093", doc)
