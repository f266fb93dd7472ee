"""The Kubernetes adapter through the official client against a FAKE API server (not a real cluster).

No Kubernetes API server can run here, so the test starts a small HTTP server on
loopback that speaks the few endpoints the adapter uses, the way the real one
does for them: GET and PATCH (strategic-merge / merge patch, `resourceVersion`
conflicts answered 409) of a node, listing pods by `spec.nodeName` and label,
and POST of a pod eviction (429 where a disruption budget forbids it). The
client is the real `kubernetes` package, configured from a kubeconfig file, so
the requests, headers and (de)serialization under test are the real ones.
"""

from __future__ import annotations

import copy
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.helpers import need_module

need_module("kubernetes", "the Kubernetes adapter (the `kubernetes` extra)")

from gangwatch.control.fence import Fencer  # noqa: E402
from gangwatch.control.kubernetes import (  # noqa: E402
    CORDONED_ANNOTATION,
    REASON_ANNOTATION,
    TAINT_KEY,
    KubernetesBackend,
    connect,
    taint_value,
)
from gangwatch.schemas import Action, Incident, encode  # noqa: E402

from gangwatch.cli import main  # noqa: E402 - after the skip

pytestmark = pytest.mark.unit


def merge(target: dict, patch: dict) -> dict:
    """JSON merge patch (RFC 7386): objects merge, null deletes, anything else (lists too) replaces."""
    out = dict(target)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


class FakeApiServer:
    """Nodes and pods in memory behind the Kubernetes REST paths the adapter uses; every request is logged."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict] = {}
        self.pods: list[dict] = []
        self.blocked: set[str] = set()  # pod names whose eviction a PodDisruptionBudget forbids
        self.requests: list[tuple[str, str, str, dict | None]] = []  # method, path, content type, body
        self.lock = threading.Lock()
        self.conflict_next_patch = False
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, code: int, obj: dict) -> None:
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw) if raw else None
                with api.lock:
                    api.requests.append((self.command, url.path, self.headers.get("Content-Type", ""), body))
                    code, obj = api.route(self.command, url.path, urllib.parse.parse_qs(url.query),
                                          self.headers.get("Content-Type", ""), body)
                self._reply(code, obj)

            do_GET = do_PATCH = do_POST = _handle  # noqa: N815 - http.server's names

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def add_node(self, name: str, *, unschedulable: bool = False, taints: list[dict] | None = None) -> None:
        self.nodes[name] = {"apiVersion": "v1", "kind": "Node",
                            "metadata": {"name": name, "resourceVersion": "1", "labels": {}, "annotations": {}},
                            "spec": {"unschedulable": unschedulable, "taints": taints or []}, "status": {}}

    def add_pod(self, name: str, node: str, *, ns: str = "train", labels: dict | None = None,
                owner: str | None = None) -> None:
        meta = {"name": name, "namespace": ns, "labels": labels or {}}
        if owner:
            meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner, "name": "x", "uid": "u"}]
        self.pods.append({"metadata": meta, "spec": {"nodeName": node, "containers": [{"name": "c"}]},
                          "status": {"phase": "Running"}})

    @staticmethod
    def status(code: int, reason: str) -> tuple[int, dict]:
        return code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code}

    def route(self, method: str, path: str, query: dict, ctype: str, body: dict | None) -> tuple[int, dict]:
        parts = path.strip("/").split("/")
        if parts == ["api", "v1", "nodes"] and method == "GET":  # paged by limit / continue, as the server does
            names = sorted(self.nodes)
            start = int(query.get("continue", ["0"])[0])
            end = start + int(query.get("limit", [len(names) or 1])[0])
            meta = {"continue": str(end)} if end < len(names) else {}
            return 200, {"apiVersion": "v1", "kind": "NodeList", "metadata": meta,
                         "items": [self.nodes[n] for n in names[start:end]]}
        if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
            node = self.nodes.get(parts[3])
            if node is None:
                return self.status(404, "NotFound")
            if method == "GET":
                return 200, node
            if method == "PATCH":
                if ctype not in ("application/strategic-merge-patch+json", "application/merge-patch+json"):
                    return self.status(415, "UnsupportedMediaType")
                rv = (body.get("metadata") or {}).get("resourceVersion")
                if self.conflict_next_patch or (rv is not None and rv != node["metadata"]["resourceVersion"]):
                    self.conflict_next_patch = False
                    node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
                    return self.status(409, "Conflict")
                new = merge(node, body)
                new["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
                self.nodes[parts[3]] = new
                return 200, new
        if parts == ["api", "v1", "pods"] and method == "GET":
            on = query.get("fieldSelector", [""])[0].removeprefix("spec.nodeName=")
            selector = dict(kv.split("=", 1) for kv in query.get("labelSelector", [""])[0].split(",") if kv)
            items = [p for p in self.pods if p["spec"]["nodeName"] == on
                     and all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())]
            return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}
        if len(parts) == 7 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods" \
                and parts[6] == "eviction" and method == "POST":
            ns, name = parts[3], parts[5]
            if name in self.blocked:
                return self.status(429, "TooManyRequests")
            self.pods = [p for p in self.pods if (p["metadata"]["namespace"], p["metadata"]["name"]) != (ns, name)]
            return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
        return self.status(404, "NotFound")

    def writes(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p, _, _ in self.requests if m != "GET"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake(tmp_path):
    api = FakeApiServer()
    for n in ("gpu-a", "gpu-b", "gpu-c"):
        api.add_node(n)
    api.kubeconfig = tmp_path / "kubeconfig"
    api.kubeconfig.write_text(json.dumps({  # JSON is YAML
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
        "users": [{"name": "gw", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "gw"}}]}))
    yield api
    api.close()


def action(id: str = "a-1", nodes: tuple[str, ...] = ("gpu-a",), type: str = "replace", incident: str = "i-1",
           job: str = "train-7") -> Action:
    return Action(id=id, ts=1_800_000_000.0, job=job, incident=incident, type=type, nodes=list(nodes),
                  reason="ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, fail_stop; culprit (confidence 0.97)")


def test_cordon_and_taint_once_with_the_incident_class(fake):
    fake.add_node("gpu-a", taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    backend = KubernetesBackend(connect(str(fake.kubeconfig)))
    fencer = Fencer(backend, act=True)
    fencer.handle(Incident(id="i-1", ts=1.0, job="train-7", cls="fail_stop"))  # names the fault class
    [o] = fencer.handle(action())
    assert o.changed and not o.error, o
    node = fake.nodes["gpu-a"]
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                                      {"key": TAINT_KEY, "value": "fail_stop", "effect": "NoSchedule"}]
    assert node["metadata"]["annotations"][CORDONED_ANNOTATION] == "i-1"
    assert node["metadata"]["annotations"][REASON_ANNOTATION].startswith("gangwatch: i-1 replace: ROBUST_CHANNEL")
    [(_, _, ctype, body)] = [r for r in fake.requests if r[0] == "PATCH"]
    assert ctype == "application/strategic-merge-patch+json" and body["metadata"]["resourceVersion"] == "1"
    assert [r for r in fake.requests if r[0] == "GET"][0][1] == "/api/v1/nodes/gpu-a"

    fencer.handle(action())  # delivered again: nothing sent
    [o2] = fencer.handle(action(id="a-2"))  # another action for the node: read, already fenced
    assert "already cordoned and tainted" in o2.what and not o2.changed
    assert fake.writes() == [("PATCH", "/api/v1/nodes/gpu-a")] and backend.patches == 1


def test_dry_run_reads_and_changes_nothing(fake):
    fake.add_pod("trainer-0", "gpu-b")
    backend = KubernetesBackend(connect(str(fake.kubeconfig)), evict_pods=True)
    [o] = Fencer(backend).handle(action(nodes=("gpu-b",)))
    assert o.what == f"would cordon and taint {TAINT_KEY}=replace:NoSchedule (dry run); would evict train/trainer-0"
    assert fake.writes() == [] and fake.nodes["gpu-b"]["spec"]["unschedulable"] is False


def test_evicts_the_jobs_pods_but_not_daemonsets_and_reports_a_budget(fake):
    fake.add_pod("trainer-0", "gpu-c", labels={"gangwatch.io/job": "train-7"})
    fake.add_pod("trainer-1", "gpu-c", labels={"gangwatch.io/job": "train-7"})
    fake.add_pod("other-job", "gpu-c", labels={"gangwatch.io/job": "train-9"})
    fake.add_pod("dcgm-exporter", "gpu-c", ns="monitoring", labels={"gangwatch.io/job": "train-7"}, owner="DaemonSet")
    fake.blocked.add("trainer-1")
    backend = KubernetesBackend(connect(str(fake.kubeconfig)), evict_pods=True,
                                pod_selector="gangwatch.io/job={job}", grace_s=30)
    [o] = Fencer(backend, act=True).handle(action(nodes=("gpu-c",)))
    assert "evicted train/trainer-0" in o.what
    assert "not evicted: train/trainer-1 (a disruption budget forbids it now)" in o.what and not o.error
    assert sorted(p["metadata"]["name"] for p in fake.pods) == ["dcgm-exporter", "other-job", "trainer-1"]
    [evict] = [r for r in fake.requests if r[1] == "/api/v1/namespaces/train/pods/trainer-0/eviction"]
    assert evict[3]["metadata"] == {"name": "trainer-0", "namespace": "train"}
    assert evict[3]["deleteOptions"]["gracePeriodSeconds"] == 30


def test_a_conflicting_change_is_redone_on_a_fresh_read(fake):
    fake.conflict_next_patch = True
    backend = KubernetesBackend(connect(str(fake.kubeconfig)))
    [o] = Fencer(backend, act=True).handle(action())
    assert o.changed and not o.error
    assert [m for m, *_ in fake.requests] == ["GET", "PATCH", "GET", "PATCH"]
    assert fake.nodes["gpu-a"]["spec"]["unschedulable"] is True


def test_unknown_node_and_unreachable_server(fake):
    [o] = Fencer(KubernetesBackend(connect(str(fake.kubeconfig))), act=True).handle(action(nodes=("gpu-zz",)))
    assert "unknown to Kubernetes" in o.what and not o.error
    fake.close()
    dead = Fencer(KubernetesBackend(connect(str(fake.kubeconfig))), act=True, retries=0)
    [o] = dead.handle(action(id="a-9"))
    assert o.error and "could not read the node" in o.what


def test_resume_undoes_only_what_gangwatch_did(fake):
    fake.add_node("gpu-b", unschedulable=True)  # an operator's cordon
    backend = KubernetesBackend(connect(str(fake.kubeconfig)))
    fencer = Fencer(backend, act=True)
    fencer.handle(action(nodes=("gpu-a", "gpu-b")))
    assert CORDONED_ANNOTATION not in fake.nodes["gpu-b"]["metadata"]["annotations"]
    with pytest.raises(ValueError, match="note"):
        fencer.restore(["gpu-a"], " ")
    a, b, c = fencer.restore(["gpu-a", "gpu-b", "gpu-c"], "ticket 88: GPU reseated")
    assert a.changed and "uncordon" in a.what
    assert fake.nodes["gpu-a"]["spec"] == {"unschedulable": False, "taints": []}
    assert REASON_ANNOTATION not in fake.nodes["gpu-a"]["metadata"]["annotations"]
    assert b.changed and "uncordon" not in b.what  # our taint goes, the operator's cordon stays
    assert fake.nodes["gpu-b"]["spec"] == {"unschedulable": True, "taints": []}
    assert c.what == "not fenced by gangwatch: left alone"


def test_cli_apply_from_a_file(fake, tmp_path, capsys):
    actions = tmp_path / "actions.jsonl"
    actions.write_bytes(encode(action(type="isolate", nodes=("n1",))) + b"\n")
    (tmp_path / "map.json").write_text('{"n1": "gpu-b"}')
    common = ["kubernetes", "apply", "--from", str(actions), "--kubeconfig", str(fake.kubeconfig),
              "--state", str(tmp_path / "k8s.jsonl"), "--node-map", str(tmp_path / "map.json")]
    assert main(common) == 0
    assert "gpu-b: would cordon and taint" in capsys.readouterr().out and fake.writes() == []
    assert main([*common, "--act"]) == 0
    assert main([*common, "--act"]) == 0
    out = capsys.readouterr().out
    assert "gpu-b: cordoned and tainted gangwatch.io/fault=isolate:NoSchedule" in out
    assert "already applied (same action id)" in out
    assert fake.writes() == [("PATCH", "/api/v1/nodes/gpu-b")]


def test_taint_values_are_valid_label_values():
    assert taint_value("fail_stop") == "fail_stop"
    assert taint_value("weird class/with spaces!") == "weird-class-with-spaces"
    assert taint_value("_") == "fault"
    assert len(taint_value("x" * 100)) == 63


def test_node_count_pages_through_the_node_list(fake):
    for i in range(1203):
        fake.add_node(f"gpu-{i:04d}")
    assert KubernetesBackend(connect(str(fake.kubeconfig))).node_count() == 1206
    pages = [r for r in fake.requests if r[:2] == ("GET", "/api/v1/nodes")]
    assert len(pages) == 3


def test_cli_fleet_breaker_trips_shows_and_resets(fake, tmp_path, capsys):
    actions = tmp_path / "actions.jsonl"
    actions.write_bytes(encode(action(id="a-1", nodes=("gpu-a",))) + b"\n"
                        + encode(action(id="a-2", type="evict_group", nodes=("gpu-b", "gpu-c"))) + b"\n"
                        + encode(action(id="a-3", type="escalate", nodes=("gpu-c",))) + b"\n")
    state = tmp_path / "k8s.jsonl"
    common = ["--kubeconfig", str(fake.kubeconfig), "--state", str(state)]
    # 3 nodes listed: 5 % of them is under the floor of 2, so a-2 (a 3rd node) trips it
    assert main(["kubernetes", "apply", "--from", str(actions), "--act", *common]) == 1
    out = capsys.readouterr().out
    assert "gpu-a: cordoned and tainted" in out
    assert "gpu-b: refused by the fleet breaker" in out and "over the limit of 2 (5% of 3 watched nodes" in out
    assert "escalate: nothing for kubernetes to do" in out and "1 refused by the fleet breaker" in out
    assert fake.writes() == [("PATCH", "/api/v1/nodes/gpu-a")]
    assert (tmp_path / "k8s.breaker.json").exists()

    assert main(["kubernetes", "breaker", *common]) == 1
    out = capsys.readouterr().out
    assert "FLEET BREAKER TRIPPED" in out and "nodes fenced within 3600 s: 1 (gpu-a)" in out
    assert "limit: 2 node(s) per 3600 s = 5% of 3 watched nodes (from kubernetes's node count)" in out
    assert "refused since the trip: 1 action(s)" in out and "a-2  job train-7  nodes gpu-b,gpu-c" in out

    assert main(["kubernetes", "apply", "--from", str(actions), "--act", *common]) == 1  # restarted: still tripped
    assert fake.writes() == [("PATCH", "/api/v1/nodes/gpu-a")]
    capsys.readouterr()

    assert main(["kubernetes", "reset-breaker", "--state", str(state), "--note", "INC-9: three real faults"]) == 0
    out = capsys.readouterr().out
    assert "reset the fleet breaker" in out and "1 action(s) refused while it was tripped" in out
    assert main(["kubernetes", "breaker", *common]) == 0
    assert "closed (fencing allowed); last reset" in capsys.readouterr().out
    assert main(["kubernetes", "apply", "--from", str(actions), "--act", *common]) == 0  # the operator's re-run
    assert fake.writes()[1:] == [("PATCH", "/api/v1/nodes/gpu-b"), ("PATCH", "/api/v1/nodes/gpu-c")]
    assert main(["kubernetes", "reset-breaker", "--state", str(state), "--note", "again"]) == 0
    assert "not tripped: nothing to reset" in capsys.readouterr().out
    journal = [json.loads(line) for line in state.read_text().splitlines()]
    assert [e.get("breaker") or e.get("status") for e in journal] == [
        "applied", "tripped", "refused-by-breaker", "refused-by-breaker", "reset", "applied"]
