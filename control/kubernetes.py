"""Kubernetes backend of the fencing adapter (`gangwatch kubernetes`): cordon and taint a faulty node.

Through the official Python client (`pip install kubernetes`), with the
credentials of a kubeconfig or, inside a pod, of its service account (RBAC:
`get`, `patch` on nodes; with pod eviction also `list` on pods and `create` on
`pods/eviction`). What one fence does, in one PATCH of the node:

- `spec.unschedulable: true` (what `kubectl cordon` does), unless already cordoned;
- the taint `gangwatch.io/fault=<class>:NoSchedule`, where `<class>` is the
  incident's class when known (`fail_stop`, `hang`, `sdc`, ...; from an
  `incident` record seen before the action, or the action's `extra.class`),
  else the action type (`replace`, `isolate`, `evict_group`, `requeue`);
- annotations `gangwatch.io/reason` (`gangwatch: <incident> <type>: <reason>`)
  and, only when gangwatch did the cordoning, `gangwatch.io/cordoned`
  (the incident), so a restore never uncordons a node an operator cordoned.

The PATCH is a strategic-merge patch carrying the node's `resourceVersion`, so a
concurrent change makes it fail with 409 and it is redone on a fresh read (taints
are one list that a patch replaces whole, as `kubectl taint` does).

With `evict_pods`, the node's pods are then evicted through the Eviction API,
which honours PodDisruptionBudgets (a 429 is reported, not forced); DaemonSet
pods, mirror (static) pods and finished pods are left, and `pod_selector` (a
label selector, `{job}` replaced by the action's job, e.g.
`gangwatch.io/job={job}`) narrows it to the job's own pods.

The fleet breaker's watched nodes, unless `--fleet-nodes` says how many, are
the nodes the API server lists (`list_node`, 500 a page; RBAC `list` on nodes).

A dry run needs no cluster: the CLI gives a backend without an API (`api=None`,
`offline` saying why: no kubeconfig, the package not installed) when none can be
had, and a node that cannot be read is said as what a real run would do
(`fence.unread`).

Restore (after a confirmed repair) removes gangwatch's taint and annotations and
uncordons only if gangwatch had cordoned.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from gangwatch.control.fence import Outcome, drain_reason, unread
from gangwatch.schemas import Action

TAINT_KEY = "gangwatch.io/fault"
TAINT_EFFECT = "NoSchedule"
REASON_ANNOTATION = "gangwatch.io/reason"
CORDONED_ANNOTATION = "gangwatch.io/cordoned"
_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def taint_value(cls: str) -> str:
    """A valid label value (63 characters of [A-Za-z0-9_.-], alphanumeric at both ends) naming the fault."""
    value = _LABEL_VALUE_BAD.sub("-", cls)[:63].strip("-_.")
    return value or "fault"


def connect(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A `CoreV1Api`: from `kubeconfig` (or $KUBECONFIG, ~/.kube/config), else the in-cluster service account."""
    import os

    from kubernetes import client, config

    if kubeconfig or context or not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig, context=context))
    config.load_incluster_config()
    return client.CoreV1Api()


class KubernetesBackend:
    """Cordons, taints (and optionally drains) nodes through a `kubernetes.client.CoreV1Api`.

    `api=None`: no API server to talk to (`offline` says why); every read fails with that reason, so only a dry
    run is of use (it says what a real run would do).
    """

    name = "kubernetes"

    def __init__(self, api: Any, *, evict_pods: bool = False, pod_selector: str = "",
                 grace_s: int | None = None, conflicts: int = 3, offline: str = "no Kubernetes API") -> None:
        self._api = api
        self.offline = offline
        self.evict_pods = evict_pods
        self.pod_selector = pod_selector
        self.grace_s = grace_s
        self.conflicts = conflicts
        self.patches = 0  # node PATCHes that succeeded: the changes made
        self.evictions = 0

    @property
    def api(self) -> Any:
        if self._api is None:
            raise ConnectionError(self.offline)
        return self._api

    def node_count(self) -> int:
        """How many nodes the API server lists (paged, 500 at a time)."""
        count, token = 0, None
        while True:
            kw = {"_continue": token} if token else {}
            page = self.api.list_node(limit=500, **kw)
            count += len(page.items or [])
            token = getattr(page.metadata, "_continue", None) if page.metadata is not None else None
            if not token:
                return count

    # --- fence ------------------------------------------------------------------------------

    def fence(self, node: str, action: Action, *, cls: str, act: bool) -> Outcome:
        value = taint_value(cls)
        for _ in range(self.conflicts + 1):
            try:
                n = self.api.read_node(node)
            except Exception as e:  # ApiException, or urllib3's connection errors
                if _status(e) == 404:
                    return Outcome(node, "unknown to Kubernetes: skipped (map gangwatch's node ids with --node-map)")
                if not act:  # a dry run needs no cluster
                    pods = " and evict its pods" if self.evict_pods else ""
                    return unread(node, f"cordon it and taint it {TAINT_KEY}={value}:{TAINT_EFFECT}{pods}, what of "
                                        "it is not done already", _why(e))
                return Outcome(node, "could not read the node", error=_why(e))
            taints = list(n.spec.taints or [])
            tainted = any(t.key == TAINT_KEY and t.effect == TAINT_EFFECT for t in taints)
            cordoned = bool(n.spec.unschedulable)
            if tainted and cordoned:
                what = "already cordoned and tainted by gangwatch: left as it is"
                return self._evict(node, action, what, act, changed=False)
            todo = ([] if cordoned else ["cordon"]) + ([] if tainted else [f"taint {TAINT_KEY}={value}:{TAINT_EFFECT}"])
            if not act:
                return replace(self._evict(node, action, f"would {' and '.join(todo)} (dry run)", act,
                                           changed=False), would=True)
            new = [self.api.api_client.sanitize_for_serialization(t) for t in taints]
            if not tainted:
                new.append({"key": TAINT_KEY, "value": value, "effect": TAINT_EFFECT})
            annotations = {REASON_ANNOTATION: drain_reason(action, limit=1000)}
            if not cordoned:
                annotations[CORDONED_ANNOTATION] = action.incident
            body = {"metadata": {"resourceVersion": n.metadata.resource_version, "annotations": annotations},
                    "spec": {"unschedulable": True, "taints": new}}
            try:
                self.api.patch_node(node, body)
            except Exception as e:
                if _status(e) == 409:
                    continue  # changed under us: read it again
                return Outcome(node, "PATCH of the node failed", error=_why(e))
            self.patches += 1
            return self._evict(node, action, " and ".join(todo).replace("cordon", "cordoned")
                               .replace("taint ", "tainted "), act, changed=True)
        return Outcome(node, "PATCH of the node failed", error=f"still conflicting after {self.conflicts} re-reads")

    def _evict(self, node: str, action: Action, what: str, act: bool, *, changed: bool) -> Outcome:
        if not self.evict_pods:
            return Outcome(node, what, changed=changed)
        selector = self.pod_selector.format(job=action.job) if self.pod_selector else None
        try:
            pods = self.api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}",
                                                        label_selector=selector).items
        except Exception as e:
            return Outcome(node, what + "; listing its pods failed", changed=changed, error=_why(e))
        pods = [p for p in pods if _evictable(p)]
        if not pods:
            return Outcome(node, what + "; no pod to evict", changed=changed)
        names = [f"{p.metadata.namespace}/{p.metadata.name}" for p in pods]
        if not act:
            return Outcome(node, what + f"; would evict {', '.join(names)}", changed=changed, would=True)
        from kubernetes import client

        done, refused = [], []
        for p, name in zip(pods, names, strict=True):
            body = client.V1Eviction(metadata=client.V1ObjectMeta(name=p.metadata.name,
                                                                  namespace=p.metadata.namespace),
                                     delete_options=(client.V1DeleteOptions(grace_period_seconds=self.grace_s)
                                                     if self.grace_s is not None else None))
            try:
                self.api.create_namespaced_pod_eviction(p.metadata.name, p.metadata.namespace, body)
                done.append(name)
                self.evictions += 1
            except Exception as e:
                status = _status(e)
                if status == 404:
                    continue  # gone already
                refused.append(f"{name} ({'a disruption budget forbids it now' if status == 429 else _why(e)})")
        text = what + (f"; evicted {', '.join(done)}" if done else "")
        if refused:
            text += f"; not evicted: {', '.join(refused)} (run again later, or evict by hand)"
        return Outcome(node, text, changed=changed or bool(done))

    # --- restore ---------------------------------------------------------------------------------

    def restore(self, node: str, note: str, *, act: bool) -> Outcome:
        for _ in range(self.conflicts + 1):
            try:
                n = self.api.read_node(node)
            except Exception as e:
                if _status(e) == 404:
                    return Outcome(node, "unknown to Kubernetes: nothing to restore")
                if not act:
                    return unread(node, f"remove the taint {TAINT_KEY} and uncordon it, what of it gangwatch did",
                                  _why(e), would=False)
                return Outcome(node, "could not read the node", error=_why(e))
            taints = list(n.spec.taints or [])
            annotations = n.metadata.annotations or {}
            ours = [t for t in taints if t.key == TAINT_KEY]
            we_cordoned = CORDONED_ANNOTATION in annotations
            if not ours and not we_cordoned:
                return Outcome(node, "not fenced by gangwatch: left alone")
            todo = (["remove the taint"] if ours else []) + (["uncordon"] if we_cordoned else [])
            if not act:
                return Outcome(node, f"would {' and '.join(todo)} (dry run)")
            body: dict[str, Any] = {
                "metadata": {"resourceVersion": n.metadata.resource_version,
                             "annotations": {REASON_ANNOTATION: None, CORDONED_ANNOTATION: None}},
                "spec": {"taints": [self.api.api_client.sanitize_for_serialization(t) for t in taints
                                    if t.key != TAINT_KEY]},
            }
            if we_cordoned:
                body["spec"]["unschedulable"] = False
            try:
                self.api.patch_node(node, body)
            except Exception as e:
                if _status(e) == 409:
                    continue
                return Outcome(node, "PATCH of the node failed", error=_why(e))
            self.patches += 1
            return Outcome(node, f"restored after repair ({' and '.join(todo)}): {note}", changed=True)
        return Outcome(node, "PATCH of the node failed", error=f"still conflicting after {self.conflicts} re-reads")


def _evictable(pod: Any) -> bool:
    """Not a DaemonSet's pod (it would come back), not a mirror pod, not finished."""
    meta = pod.metadata
    if any(o.kind == "DaemonSet" for o in (meta.owner_references or [])):
        return False
    if "kubernetes.io/config.mirror" in (meta.annotations or {}):
        return False
    return (pod.status.phase if pod.status else None) not in ("Succeeded", "Failed")


def _status(e: Exception) -> int | None:
    return getattr(e, "status", None)


def _why(e: Exception) -> str:
    status = _status(e)
    if status is not None:
        reason = getattr(e, "reason", "") or ""
        body = str(getattr(e, "body", "") or "")
        return f"HTTP {status} {reason}".strip() + (f": {body[:200]}" if body else "")
    return f"{type(e).__name__}: {str(e)[:200]}"
