"""`gangwatch slurm apply|resume|breaker|reset-breaker`: drain Slurm nodes that gangwatch takes out, resume them
after repair; the fleet breaker that stops the draining when too many nodes went within an hour."""

from __future__ import annotations

import argparse

from gangwatch.cli import fence
from gangwatch.cli.options import opt


def _backend(args: argparse.Namespace):
    from gangwatch.control.slurm import SlurmBackend

    return SlurmBackend(args.scontrol)


def cmd_apply(args: argparse.Namespace) -> int:
    verify = fence.topic_verifier(args)  # the secret first: without it nothing could be applied
    return fence.apply(args, _backend(args), verify)


def cmd_resume(args: argparse.Namespace) -> int:
    return fence.resume(args, _backend(args))


def cmd_breaker(args: argparse.Namespace) -> int:
    return fence.breaker(args, lambda: _backend(args))


def _opts(p: argparse.ArgumentParser) -> None:
    opt(p, "--scontrol", default="scontrol", env="GANGWATCH_SCONTROL",
        help="the scontrol program (it finds the cluster through SLURM_CONF or /etc/slurm/slurm.conf)")


def register(sub: argparse._SubParsersAction) -> None:
    fence.add_commands(
        sub, "slurm", help="drain the nodes gangwatch takes out in Slurm (scontrol); dry run unless --act",
        description="The Slurm adapter: for each replace, isolate, evict_group or requeue action naming "
        "nodes, `scontrol update NodeName=N State=DRAIN Reason=\"gangwatch: <incident> <type>: <reason>\"` "
        "for each of its nodes, once per action id. A node already drained is left as it is (another drain's "
        "reason is kept). Nodes come back only with `gangwatch slurm resume NODE --repaired NOTE --act`, and "
        "only those gangwatch drained. A fleet breaker stops all draining once an action would drain more than "
        "5 % of the watched nodes within an hour (`gangwatch slurm breaker` shows it; a person resets it with "
        "`gangwatch slurm reset-breaker --note NOTE`).",
        fence="drain", backend_opts=_opts, cmd_apply=cmd_apply, cmd_resume=cmd_resume,
        cmd_breaker=cmd_breaker, counted="the nodes `scontrol show node` lists",
        example="examples:\n  gangwatch slurm apply --from out/actions.jsonl              # dry run: what would "
        "be drained\n  gangwatch slurm apply --bootstrap kafka1:9092 --act --state /var/lib/gangwatch/slurm.jsonl\n"
        "  gangwatch slurm resume gpu-0003 --repaired 'RMA 4711: GPU swapped, dcgmi diag -r 3 passed' --act\n"
        "  gangwatch slurm breaker --state /var/lib/gangwatch/slurm.jsonl         # tripped? why? (exit 1 if so)\n"
        "  gangwatch slurm reset-breaker --state /var/lib/gangwatch/slurm.jsonl --note 'INC-9: rack PDU, "
        "drains checked'")
