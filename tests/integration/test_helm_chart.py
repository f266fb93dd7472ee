"""The Helm chart deploy/helm/gangwatch, checked with the real `helm` and the real gangwatch command line.

No cluster here: the chart is linted (`helm lint --strict`) and rendered (`helm template`) over each value set
in deploy/helm/gangwatch/ci/, and the rendered manifests are read back:

- every container that runs `gangwatch` (the worker, the agent, the fencing adapter) runs a real subcommand
  whose parser takes the rendered arguments (gangwatch's own `build_parser`), with only options its `--help`
  lists, and is given only GANGWATCH_* variables that command reads;
- the worker's settings file from `config` (the ConfigMap) is one `gangwatch config show` accepts;
- what the agent takes from the host is what values.yaml says and no more: host PID, /dev/kmsg read-only, the
  node name from the downward API, the relay socket in the host directory the training pods' snippet mounts,
  privileged only where asked, else exactly the two capabilities;
- the workers are one group (replicas, a PodDisruptionBudget over their pods); Secrets are referenced, never
  rendered; the PrometheusRule carries exactly the groups of deploy/prometheus/rules/gangwatch.rules.yml, and
  the ServiceMonitors set the `job` names those rules match on;
- a value a user must set, left out, stops the render with a message naming it.

- every rendered manifest validates against the Kubernetes API schemas (`kubernetes-validate --strict`, for the
  oldest Kubernetes the chart allows, 1.25, and 1.37); the operator's kinds (ServiceMonitor, PrometheusRule) have
  no schema there and are only warned about.

helm comes from GANGWATCH_HELM or PATH (build it: `GOBIN=DIR go install helm.sh/helm/v4/cmd/helm@v4.3.2`), and
kubernetes-validate from GANGWATCH_KUBERNETES_VALIDATE, PATH or beside this Python (`pip install
kubernetes-validate`); without one, its tests skip with the reason, and fail under GANGWATCH_REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO, missing, need_module, subparser

yaml = need_module("yaml", "PyYAML (the `dev` extra)")

from gangwatch.schemas.security import ENV as KAFKA_ENV  # noqa: E402
from gangwatch.schemas.signature import SECRET_ENV  # noqa: E402
from gangwatch.sinks.store import PASSWORD_ENV, USER_ENV  # noqa: E402

from gangwatch.cli import build_parser  # noqa: E402 - after the skip

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("helm")]  # (one worker waits for helm)

CHART = REPO / "deploy" / "helm" / "gangwatch"
VALUE_SETS = sorted((CHART / "ci").glob("*-values.yaml"))
RULES = REPO / "deploy" / "prometheus" / "rules" / "gangwatch.rules.yml"
TRAINING_POD = REPO / "deploy" / "helm" / "examples" / "training-pod.yaml"
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")
# variables a command reads that are not one of its options: Kafka security, the signing secret, the store's
# user, the settings file
READ_BY_ALL = set(KAFKA_ENV.values()) | {SECRET_ENV}
READ_BY = {("worker",): READ_BY_ALL | {USER_ENV, PASSWORD_ENV, "GANGWATCH_CONFIG"}}
REQUIRED = {"image.repository": "registry.example.com/gangwatch", "kafka.bootstrap": "kafka:9092",
            "signing.existingSecret": "gangwatch-signing"}


@pytest.fixture(scope="module")
def helm() -> str:
    return program("GANGWATCH_HELM", "helm", "build it: GOBIN=/tmp/helmbin go install helm.sh/helm/v4/cmd/helm@v4.3.2 "
                   "and set GANGWATCH_HELM=/tmp/helmbin/helm")


def program(env: str, name: str, how: str) -> str:
    """A program named by the variable `env`, else found on PATH; else skip (a failure under
    GANGWATCH_REQUIRE_SERVICES=1). Where `env`_BUILDING names a file, the program is being built beside the tests
    (CI builds helm while the other tests run): the file says `building` until the build ends, then `done RC`."""
    building = os.environ.get(f"{env}_BUILDING")
    if building:
        wait_for_build(Path(building), name)
    named = os.environ.get(env)
    beside = Path(sys.executable).parent / name  # installed into this environment (.venv/bin), not on PATH
    found = named or shutil.which(name) or (str(beside) if beside.exists() else None)
    if not found or not os.access(found, os.X_OK):
        missing(f"{name} not found ({env + '=' + named if named else f'not on PATH, {env} unset'}); {how}")
    return found


BUILD_S = 900.0  # a cold build of helm took 3.5 min on CI's 2 cores beside the tests


def wait_for_build(status: Path, name: str) -> None:
    """Until the build that `status` reports on has ended (at most `BUILD_S`)."""
    deadline = time.monotonic() + BUILD_S
    said = ""
    while time.monotonic() < deadline:
        said = status.read_text().strip() if status.exists() else "(no status file yet)"
        if said.startswith("done"):
            assert said == "done 0", f"the build of {name} failed: {said} (its log is beside {status})"
            return
        time.sleep(1.0)
    raise AssertionError(f"the build of {name} did not end within {BUILD_S:g} s; its status said: {said}")


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HELM_CACHE_HOME": os.environ.get("HELM_CACHE_HOME", "/tmp/helm-cache")})


def render(helm: str, *args: str) -> list[dict[str, Any]]:
    done = run_helm(helm, "template", "gangwatch", str(CHART), "--namespace", "monitoring", *args)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture(scope="module")
def rendered(helm) -> dict[str, list[dict[str, Any]]]:
    assert {p.name for p in VALUE_SETS} >= {"minimal-values.yaml", "secure-values.yaml", "operator-values.yaml"}
    return {p.name: render(helm, "-f", str(p)) for p in VALUE_SETS}


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, component: str | None = None) -> dict[str, Any]:
    found = [d for d in of_kind(docs, kind)
             if component is None or d["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    assert len(found) == 1, f"{len(found)} {kind} {component or ''}"
    return found[0]


def split_command(args: list[str]) -> tuple[list[str], list[str]]:
    """(the subcommand's words, its options) of `gangwatch ARGS`."""
    words, rest = [], list(args)
    while rest and not rest[0].startswith("-"):
        words.append(rest.pop(0))
        if not any(isinstance(a, argparse._SubParsersAction) for a in subparser(words)._actions):
            break
    return words, rest


def parse(args: list[str]) -> argparse.Namespace:
    """gangwatch's own parser over rendered arguments; a failure says argparse's message, not a SystemExit."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(args)
    except SystemExit:
        raise AssertionError(f"`gangwatch {' '.join(args)}` does not parse: {err.getvalue().strip()}") from None


def env_names(container: dict[str, Any], configmaps: dict[str, dict[str, str]]) -> dict[str, Any]:
    """Every variable a container gets: its env, and the keys of the ConfigMaps of its envFrom."""
    names: dict[str, Any] = {}
    for src in container.get("envFrom", []):
        ref = src["configMapRef"]["name"]
        assert ref in configmaps, f"envFrom names ConfigMap {ref}, which the chart does not render"
        names.update({k: v for k, v in configmaps[ref].items() if k.isupper()})
    for e in container.get("env", []):
        names[e["name"]] = e.get("value", e.get("valueFrom"))
    return names


def gangwatch_containers(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for d in docs:
        if d["kind"] in WORKLOADS:
            for c in d["spec"]["template"]["spec"]["containers"]:
                if c.get("command") == ["gangwatch"]:
                    found.append((f"{d['kind']}/{d['metadata']['name']}", c))
    return found


# --- lint and render ------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", VALUE_SETS, ids=lambda p: p.name)
def test_helm_lint_strict(helm, values):
    done = run_helm(helm, "lint", "--strict", str(CHART), "-f", str(values))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout, done.stdout


def test_every_value_set_renders_the_parts(rendered):
    kinds = {name: sorted(d["kind"] for d in docs) for name, docs in rendered.items()}
    for name, docs in rendered.items():
        for kind in ("ConfigMap", "StatefulSet", "DaemonSet", "PodDisruptionBudget", "Service", "ServiceAccount"):
            assert of_kind(docs, kind), f"{name}: no {kind} ({kinds[name]})"
        assert not of_kind(docs, "Secret"), f"{name}: the chart renders a Secret: secrets are referenced only"
    operator = rendered["operator-values.yaml"]
    assert len(of_kind(operator, "ServiceMonitor")) == 2 and of_kind(operator, "PrometheusRule")
    assert one(operator, "Deployment", "fence") and of_kind(operator, "ClusterRole")
    assert not of_kind(rendered["minimal-values.yaml"], "ServiceMonitor")
    assert not of_kind(rendered["minimal-values.yaml"], "Deployment")  # no fencing unless asked


@pytest.mark.parametrize("left_out", sorted(REQUIRED))
def test_a_value_the_user_must_set_left_out_stops_the_render(helm, left_out):
    sets = [f"{k}={v}" for k, v in REQUIRED.items() if k != left_out]
    done = run_helm(helm, "template", "gangwatch", str(CHART), *(a for s in sets for a in ("--set", s)))
    assert done.returncode != 0, f"rendered without {left_out}"
    assert f"{left_out} is required" in done.stderr, done.stderr
    assert run_helm(helm, "template", "gangwatch", str(CHART),
                    *(a for s in [f"{k}={v}" for k, v in REQUIRED.items()] for a in ("--set", s))).returncode == 0


# --- the commands the containers run --------------------------------------------------------------------


@pytest.mark.parametrize("values", [p.name for p in VALUE_SETS])
def test_the_rendered_commands_are_ones_gangwatch_accepts(rendered, values):
    docs = rendered[values]
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in of_kind(docs, "ConfigMap")}
    seen = set()
    for where, c in gangwatch_containers(docs):
        args = [str(a) for a in c["args"]]
        words, rest = split_command(args)
        seen.add(tuple(words))
        p = subparser(words)
        help_text = p.format_help()
        for arg in rest:
            if arg.startswith("--"):
                flag = arg.split("=", 1)[0]
                assert any(f"{flag}{end}" in help_text for end in (" ", "\n", ",")), \
                    f"{values} {where}: `gangwatch {' '.join(words)} --help` has no {flag}"
        ns = parse(args)
        assert ns is not None
        reads = {s.env for s in p.get_default("_env_options") or () if s.env} | READ_BY.get(tuple(words), READ_BY_ALL)
        for name in env_names(c, configmaps):
            if name.startswith("GANGWATCH_"):
                assert name in reads, f"{values} {where}: `gangwatch {' '.join(words)}` reads no {name}"
    want = {("worker",), ("agent",)} | ({("kubernetes", "apply")} if values == "operator-values.yaml" else set())
    assert seen == want, seen


def test_a_bad_rendered_command_is_caught():
    with pytest.raises(AssertionError, match="does not parse"):
        parse(["worker", "--partitions", "eight"])
    with pytest.raises(AssertionError, match="not a gangwatch command"):
        subparser(["wroker"])


@pytest.mark.parametrize("values", [p.name for p in VALUE_SETS])
def test_the_worker_takes_the_rendered_settings(rendered, values, tmp_path):
    """`gangwatch config show` with the worker's rendered variables and settings file: every setting known."""
    docs = rendered[values]
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in of_kind(docs, "ConfigMap")}
    (_, worker), = [(w, c) for w, c in gangwatch_containers(docs) if c["args"][0] == "worker"]
    cm = configmaps[worker["envFrom"][0]["configMapRef"]["name"]]
    (tmp_path / "gangwatch.toml").write_text(cm["gangwatch.toml"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANGWATCH_")}
    for name, value in env_names(worker, configmaps).items():
        if not isinstance(value, str):  # secretKeyRef: any value; the secret ones must show masked
            value = "hidden-value" if ("PASSWORD" in name or "SECRET" in name) else "from-a-secret"
        env[name] = value
    env["GANGWATCH_CONFIG"] = str(tmp_path / "gangwatch.toml")
    for name in ("GANGWATCH_KAFKA_SSL_CAFILE", "GANGWATCH_KAFKA_SSL_CERTFILE", "GANGWATCH_KAFKA_SSL_KEYFILE"):
        if name in env:  # mounted from a Secret in the pod
            (tmp_path / name).write_text("pem")
            env[name] = str(tmp_path / name)
    done = subprocess.run([sys.executable, "-m", "gangwatch", "config", "show"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    if values == "secure-values.yaml":
        assert any(line.split()[:2] == ["triage.budgets.total", "900.0"] and "toml" in line
                   for line in done.stdout.splitlines()), done.stdout
        assert "hidden-value" not in done.stdout  # the password and the signing secret are masked


# --- what the agent takes from the host -----------------------------------------------------------------


def agent_pod(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = one(docs, "DaemonSet", "agent")["spec"]["template"]["spec"]
    (agent,) = [c for c in spec["containers"] if c["name"] == "agent"]
    return spec, agent


def test_the_agent_takes_from_the_host_what_values_say(rendered):
    spec, agent = agent_pod(rendered["minimal-values.yaml"])
    assert spec["hostPID"] is True and spec["runtimeClassName"] == "nvidia"
    assert not spec.get("hostNetwork") and spec["automountServiceAccountToken"] is False
    assert "resources" not in agent or "nvidia.com/gpu" not in str(agent["resources"])  # takes no GPU
    env = {e["name"]: e for e in agent["env"]}
    assert env["GANGWATCH_NODE"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    assert volumes["kmsg"]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert mounts["kmsg"] == {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True}
    args = agent["args"]
    assert args[args.index("--kmsg") + 1] == "/dev/kmsg"
    assert agent["securityContext"]["privileged"] is True

    # the relay: the socket the agent listens on is the one the training pod's snippet names, in the host
    # directory both mount at the same path (and the flight-recorder directory likewise)
    pod = yaml.safe_load(TRAINING_POD.read_text())
    trainer = pod["spec"]["containers"][0]
    tenv = {e["name"]: e for e in trainer["env"]}
    assert args[args.index("--relay") + 1] == tenv["GANGWATCH_RELAY"]["value"]
    assert tenv["GANGWATCH_NODE"]["valueFrom"] == env["GANGWATCH_NODE"]["valueFrom"]
    tvol = {v["name"]: v["hostPath"]["path"] for v in pod["spec"]["volumes"]}
    tmount = {m["name"]: m["mountPath"] for m in trainer["volumeMounts"]}
    for name, path in (("relay", "/run/gangwatch"), ("flight", "/var/lib/gangwatch/flight")):
        assert mounts[name]["mountPath"] == path and tmount[f"gangwatch-{name}"] == path
        assert volumes[name]["hostPath"]["path"] == tvol[f"gangwatch-{name}"]
    assert tenv["TORCH_FR_DUMP_TEMP_FILE"]["value"].startswith(args[args.index("--flight-dir") + 1] + "/")
    trainer_reads = {"GANGWATCH_JOB", "GANGWATCH_NODE", "GANGWATCH_RELAY", "GANGWATCH_BOOTSTRAP",
                     "GANGWATCH_TOPIC_PREFIX", "GANGWATCH_SPOOL_DIR", "GANGWATCH_METRICS_PORT"}
    assert {n for n in tenv if n.startswith("GANGWATCH_")} <= trainer_reads


def test_the_unprivileged_agent_has_exactly_two_capabilities(rendered):
    spec, agent = agent_pod(rendered["operator-values.yaml"])
    sc = agent["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE", "SYSLOG"]}
    assert "runtimeClassName" not in spec and spec["securityContext"]["supplementalGroups"] == [4]
    args = agent["args"]
    assert args[args.index("--kmsg") + 1] == "/host/kernel.log"
    assert args[args.index("--relay") + 1] == "off"
    assert {v["name"]: v for v in spec["volumes"]}["kernel-log"]["hostPath"]["path"] == "/var/log/kern.log"


# --- the worker group, secrets, monitoring --------------------------------------------------------------


def test_the_workers_are_one_group_with_a_disruption_budget(rendered):
    for name, docs in rendered.items():
        sts = one(docs, "StatefulSet", "worker")
        pdb = one(docs, "PodDisruptionBudget", "worker")
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
        assert pdb["spec"]["maxUnavailable"] == 1
        args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--app-id") + 1] == "gangwatch"
    secure = one(rendered["secure-values.yaml"], "StatefulSet", "worker")
    assert secure["spec"]["replicas"] == 4 and secure["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    args = secure["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--table-store") + 1] == "rocksdb://" and "--no-create-topics" in args


def test_secrets_are_referenced_never_embedded(rendered):
    worker = one(rendered["secure-values.yaml"], "StatefulSet", "worker")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in worker["containers"][0]["env"]}
    for name, secret in (("GANGWATCH_WEBHOOK_SECRET", "gangwatch-signing"), ("GANGWATCH_KAFKA_PASSWORD",
                         "gangwatch-kafka-user"), ("GANGWATCH_CLICKHOUSE_PASSWORD", "gangwatch-clickhouse")):
        assert env[name]["valueFrom"]["secretKeyRef"]["name"] == secret and "value" not in env[name]
    assert {v["name"]: v for v in worker["volumes"]}["kafka-tls"]["secret"]["secretName"] == "gangwatch-kafka-tls"
    assert env["GANGWATCH_STORE"]["value"].startswith("clickhouses://clickhouse.example.com:9440/gangwatch")


def test_the_prometheus_rule_is_the_rules_file_and_the_monitors_set_its_job_names(rendered):
    docs = rendered["operator-values.yaml"]
    rule = one(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    services = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in of_kind(docs, "Service")}
    jobs = set()
    for monitor in of_kind(docs, "ServiceMonitor"):
        component = monitor["metadata"]["labels"]["app.kubernetes.io/component"]
        service = services[component]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        jobs.add(service["metadata"]["labels"][monitor["spec"]["jobLabel"]])
        assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    assert jobs == {"gangwatch-worker", "gangwatch-agent"}
    assert all(f'job="{j}"' in RULES.read_text() for j in jobs)


def test_the_chart_reads_the_rules_through_its_link(helm, tmp_path):
    """One source: the chart's files/gangwatch.rules.yml links to the rules file, and `helm package` carries it."""
    link = CHART / "files" / "gangwatch.rules.yml"
    assert link.is_symlink() and link.resolve() == RULES.resolve()
    done = run_helm(helm, "package", str(CHART), "--destination", str(tmp_path))
    assert done.returncode == 0, done.stderr
    (package,) = tmp_path.glob("gangwatch-*.tgz")
    with tarfile.open(package) as tar:
        member = tar.getmember("gangwatch/files/gangwatch.rules.yml")
        assert member.isfile() and tar.extractfile(member).read() == RULES.read_bytes()


def test_the_fencing_adapter_has_only_the_verbs_it_uses_and_keeps_its_journal(rendered):
    docs = rendered["operator-values.yaml"]
    role = one(docs, "ClusterRole", "fence")
    verbs = {(r["resources"][0], v) for r in role["rules"] for v in r["verbs"]}
    assert verbs == {("nodes", "get"), ("nodes", "list"), ("nodes", "patch"), ("pods", "list"),
                     ("pods/eviction", "create")}
    spec = one(docs, "Deployment", "fence")["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"
    pod = spec["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    state = env["GANGWATCH_KUBERNETES_STATE"]
    mount = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}["state"]
    assert state.startswith(mount + "/")
    assert {v["name"]: v for v in pod["volumes"]}["state"]["persistentVolumeClaim"]["claimName"] == \
        one(docs, "PersistentVolumeClaim", "fence")["metadata"]["name"]
    args = pod["containers"][0]["args"]
    assert "--act" in args and args[args.index("--pod-selector") + 1] == "gangwatch.io/job={job}"


# --- the Kubernetes schemas -----------------------------------------------------------------------------

OPERATOR_KINDS = ("ServiceMonitor", "PrometheusRule")  # CRDs: no schema in kubernetes-validate


@pytest.fixture(scope="module")
def kubernetes_validate() -> str:
    return program("GANGWATCH_KUBERNETES_VALIDATE", "kubernetes-validate",
                   "install it: pip install kubernetes-validate")


def validate(tool: str, manifest: Path, version: str) -> subprocess.CompletedProcess:
    return subprocess.run([tool, "--strict", "--quiet", "-k", version, str(manifest)], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("version", ["1.25.0", "1.37.0"])
@pytest.mark.parametrize("values", VALUE_SETS, ids=lambda p: p.name)
def test_every_rendered_manifest_validates_against_the_kubernetes_schemas(helm, kubernetes_validate, values, version,
                                                                           tmp_path):
    done = run_helm(helm, "template", "gangwatch", str(CHART), "--namespace", "monitoring", "-f", str(values))
    assert done.returncode == 0, done.stderr
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(done.stdout)
    checked = validate(kubernetes_validate, manifest, version)
    out = checked.stdout + checked.stderr
    assert checked.returncode == 0 and "ERROR" not in out, out
    for line in out.splitlines():
        if line.startswith("WARN"):
            assert any(f"kind {kind} " in line for kind in OPERATOR_KINDS), line


def test_the_schema_check_catches_a_bad_manifest(kubernetes_validate, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec:\n"
                   "  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n"
                   "    spec:\n      hostPIDs: true\n"
                   "      containers: [{name: c, image: i, ports: [{containerPort: metrics}]}]\n")
    checked = validate(kubernetes_validate, bad, "1.37.0")
    assert checked.returncode != 0 and "containerPort" in checked.stdout + checked.stderr
