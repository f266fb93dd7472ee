"""`gangwatch kubernetes apply|resume|breaker|reset-breaker`: cordon and taint Kubernetes nodes that gangwatch takes
out, undo it after repair; the fleet breaker that stops it when too many nodes went within an hour."""

from __future__ import annotations

import argparse

from gangwatch.cli import fence
from gangwatch.cli.options import UserError, at_least_zero, integer, opt


def _backend(args: argparse.Namespace):
    from gangwatch.control.kubernetes import KubernetesBackend, connect

    api, offline = None, ""
    try:
        api = connect(args.kubeconfig, args.context)
    except ImportError as e:
        if getattr(args, "act", False):
            raise
        offline = f"the kubernetes package is not installed ({e}; pip install 'gangwatch[kubernetes]')"
    except Exception as e:  # kubernetes.config.ConfigException and the file errors under it
        if type(e).__name__ != "ConfigException" and not isinstance(e, OSError):
            raise
        offline = (f"no Kubernetes API to talk to: {e} (give --kubeconfig FILE / --context NAME, set KUBECONFIG, "
                   "or run it in a pod with a service account)")
        if getattr(args, "act", False):
            raise UserError(offline) from None
    # a dry run (and `breaker`) goes on without a cluster: it says what a real run would do
    return KubernetesBackend(api, evict_pods=getattr(args, "evict_pods", False),
                             pod_selector=getattr(args, "pod_selector", None) or "",
                             grace_s=getattr(args, "grace", None), offline=offline or "no Kubernetes API")


def cmd_apply(args: argparse.Namespace) -> int:
    verify = fence.topic_verifier(args)  # the secret first: without it nothing could be applied
    return fence.apply(args, _backend(args), verify)


def cmd_resume(args: argparse.Namespace) -> int:
    return fence.resume(args, _backend(args))


def cmd_breaker(args: argparse.Namespace) -> int:
    return fence.breaker(args, lambda: _backend(args))


def _opts(p: argparse.ArgumentParser) -> None:
    opt(p, "--kubeconfig", env="KUBECONFIG", help="kubeconfig file (default: ~/.kube/config, or the pod's "
        "service account inside a cluster)")
    opt(p, "--context", env="GANGWATCH_KUBERNETES_CONTEXT", help="kubeconfig context (default: the current one)")
    if p.prog.endswith("apply"):
        p.add_argument("--evict-pods", action="store_true",
                       help="also evict the node's pods through the Eviction API (PodDisruptionBudgets apply; "
                       "DaemonSet and mirror pods stay)")
        opt(p, "--pod-selector", env="GANGWATCH_KUBERNETES_POD_SELECTOR",
            help="with --evict-pods: only pods matching this label selector; {job} is the action's job "
            "(e.g. gangwatch.io/job={job})")
        opt(p, "--grace", type=at_least_zero(integer), env=False,
            help="with --evict-pods: grace period seconds (default: each pod's own)")


def register(sub: argparse._SubParsersAction) -> None:
    fence.add_commands(
        sub, "kubernetes", help="cordon and taint the nodes gangwatch takes out in Kubernetes; dry run unless --act",
        description="The Kubernetes adapter: for each replace, isolate, evict_group or requeue action naming "
        "nodes, cordon each of its nodes and taint it gangwatch.io/fault=<class>:NoSchedule (one PATCH, "
        "annotated with the reason), once per action id; --evict-pods also evicts its pods. Nodes come back "
        "only with `gangwatch kubernetes resume NODE --repaired NOTE --act`, and only what gangwatch did is "
        "undone (an operator's cordon stays). A fleet breaker stops all fencing once an action would fence more "
        "than 5 % of the watched nodes within an hour (`gangwatch kubernetes breaker` shows it; a person resets "
        "it with `gangwatch kubernetes reset-breaker --note NOTE`).",
        fence="cordon and taint", backend_opts=_opts, cmd_apply=cmd_apply, cmd_resume=cmd_resume,
        cmd_breaker=cmd_breaker, counted="the nodes the API server lists",
        example="examples:\n  gangwatch kubernetes apply --from out/actions.jsonl        # dry run\n"
        "  gangwatch kubernetes apply --bootstrap kafka1:9092 --act --evict-pods --pod-selector "
        "'gangwatch.io/job={job}'\n  gangwatch kubernetes resume gpu-node-17 --repaired 'ticket 88: NIC reseated' "
        "--act\n  gangwatch kubernetes breaker                                  # tripped? why? (exit 1 if so)\n"
        "  gangwatch kubernetes reset-breaker --note 'INC-9: detector fixed in 1.4.2, cordons checked'")
