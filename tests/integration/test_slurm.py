"""The Slurm adapter against a real single-host Slurm (Debian's `slurm-wlm` and `munge`), started by the test.

The fixture starts a private munged (its own key and socket), a slurmctld and
four slurmd (nodes gpu-0000..gpu-0003, all on 127.0.0.1 with ports of their
own), everything in the foreground with state, spool and logs under a temp
directory, waits until `sinfo` shows the four nodes idle, and stops every
daemon afterwards. Needs root (slurmd runs jobs as any user).

Checked: an action drains its nodes with gangwatch's reason; the same action
delivered twice, or again after a restart, drains once (counted `scontrol
update` calls); a dry run changes nothing; an operator's drain is left alone;
`resume` brings back only a node gangwatch drained.
"""

from __future__ import annotations

import os
import socket
import subprocess

import pytest
from gangwatch.control.fence import AppliedLog, Fencer
from gangwatch.control.slurm import SlurmBackend
from gangwatch.schemas import Action, Incident, encode

from gangwatch.cli import main
from tests.helpers import missing
from tests.integration.daemons import Daemon, free_port, free_port_range, require_program, wait_until

pytestmark = pytest.mark.integration

NODES = [f"gpu-000{i}" for i in range(4)]

CONF = """\
ClusterName=gwtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/log/slurmctld.log
SlurmdLogFile={dir}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
ReturnToService=2
MpiDefault=none
NodeName=gpu-[0000-0003] NodeHostname={host} NodeAddr=127.0.0.1 Port=[{first}-{last}] CPUs=1 RealMemory=100
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """The environment (SLURM_CONF set) of a running four-node Slurm; torn down after the module."""
    munged = require_program("munged", package="munge")
    slurmctld = require_program("slurmctld", package="slurm-wlm")
    slurmd = require_program("slurmd", package="slurm-wlm")
    require_program("scontrol", package="slurm-wlm")
    if os.geteuid() != 0:
        missing("a test Slurm needs root (slurmd)")
    d = tmp_path_factory.mktemp("slurm")
    for sub in ("munge", "state", "spool", "log"):
        (d / sub).mkdir(mode=0o700)
    key = d / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    sock = d / "munge" / "socket"
    first = free_port_range(len(NODES))
    conf = d / "slurm.conf"
    conf.write_text(CONF.format(host=socket.gethostname().split(".")[0], ctld_port=free_port(), munge_socket=sock,
                                dir=d, first=first, last=first + len(NODES) - 1))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons: list[Daemon] = []
    try:
        daemons.append(Daemon("munged", [munged, "-F", "--force", f"--socket={sock}", f"--key-file={key}",
                                         f"--pid-file={d / 'munge' / 'pid'}", f"--log-file={d / 'log' / 'munged.log'}",
                                         f"--seed-file={d / 'munge' / 'seed'}"], d / "log" / "munged.out"))
        wait_until(sock.exists, 20, "munged's socket", alive=daemons[-1])
        daemons.append(Daemon("slurmctld", [slurmctld, "-D", "-c", "-f", str(conf)], d / "log" / "slurmctld.out",
                              env=env))
        ctld = daemons[-1]
        wait_until(lambda: subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True,
                                          timeout=10).stdout.count("UP") > 0, 30, "slurmctld to answer", alive=ctld)
        for node in NODES:
            daemons.append(Daemon(f"slurmd {node}", [slurmd, "-D", "-N", node, "-f", str(conf)],
                                  d / "log" / f"slurmd-{node}.out", env=env))

        def all_idle() -> bool:
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=env, capture_output=True, text=True,
                                 timeout=10).stdout.split()
            states = dict(zip(out[::2], out[1::2], strict=True))
            return all(states.get(n) == "idle" for n in NODES)

        wait_until(all_idle, 60, "four idle Slurm nodes in sinfo", every_s=0.3, alive=ctld)
        yield env
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


def show(env: dict[str, str], node: str) -> str:
    return subprocess.run(["scontrol", "show", "node", "-o", node], env=env, capture_output=True, text=True,
                          check=True, timeout=10).stdout


def action(id: str, nodes: list[str], type: str = "replace", reason: str = "Xid 79: GPU fell off the bus",
           incident: str | None = None) -> Action:
    return Action(id=id, ts=1_800_000_000.0, job="train-7", incident=incident or f"i-{id}", type=type, nodes=nodes,
                  reason=reason, path="hot")


class Counting:
    """subprocess.run, counting the `scontrol update` calls."""

    def __init__(self) -> None:
        self.updates = 0

    def __call__(self, argv, **kw):
        self.updates += argv[1] == "update"
        return subprocess.run(argv, **kw)


def test_an_action_delivered_twice_drains_its_node_once(slurm, tmp_path):
    run = Counting()
    state = tmp_path / "applied.jsonl"
    fencer = Fencer(SlurmBackend(env=slurm, run=run), act=True, applied=AppliedLog(state))
    a = action("a-0", ["gpu-0000"])
    [first] = fencer.handle(a)
    assert first.changed and not first.error
    line = show(slurm, "gpu-0000")
    assert "DRAIN" in line and "Reason=gangwatch: i-a-0 replace: Xid 79: GPU fell off the bus [" in line
    assert fencer.handle(a) == [] and fencer.duplicates == 1  # the same delivery again
    # a restarted adapter reading the same log: skipped before any scontrol call
    again = Fencer(SlurmBackend(env=slurm, run=run), act=True, applied=AppliedLog(state))
    assert again.handle(a) == []
    # a different action for a node gangwatch already drained: read, not re-drained (the reason's timestamp stays)
    [o] = fencer.handle(action("a-0b", ["gpu-0000"], reason="another incident"))
    assert not o.changed and "already drained by gangwatch" in o.what
    assert show(slurm, "gpu-0000") == line
    assert run.updates == 1


def test_cli_dry_run_then_act_then_resume_after_repair(slurm, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    actions = tmp_path / "actions.jsonl"
    inc = Incident(id="i-g", ts=1.0, job="train-7", cls="fail_stop")
    actions.write_bytes(b"\n".join(encode(r) for r in (
        inc, action("a-g", ["n1", "n2"], type="evict_group", reason="NCCL timeouts name the pp group", incident="i-g"),
        action("a-e", [], type="escalate", reason="a human must look"))) + b"\n")
    node_map = tmp_path / "nodes.json"
    node_map.write_text('{"n1": "gpu-0001", "n2": "gpu-0002"}')
    state = tmp_path / "slurm-applied.jsonl"
    common = ["--from", str(actions), "--state", str(state), "--node-map", str(node_map)]

    assert main(["slurm", "apply", *common]) == 0  # dry run
    out = capsys.readouterr().out
    assert "gpu-0001: would drain (dry run)" in out and "escalate: nothing for slurm to do" in out
    assert all("DRAIN" not in show(slurm, n) for n in ("gpu-0001", "gpu-0002"))
    assert not state.exists()

    assert main(["slurm", "apply", *common, "--act"]) == 0
    for n in ("gpu-0001", "gpu-0002"):
        assert "Reason=gangwatch: i-g evict_group: NCCL timeouts name the pp group" in show(slurm, n)
    assert main(["slurm", "apply", *common, "--act"]) == 0
    assert "already applied (same action id)" in capsys.readouterr().out

    # an operator drains gpu-0003 for their own reasons: gangwatch neither overwrites nor resumes it
    subprocess.run(["scontrol", "update", "NodeName=gpu-0003", "State=DRAIN", "Reason=bios update"], env=slurm,
                   check=True, timeout=10)
    [o] = Fencer(SlurmBackend(env=slurm), act=True).handle(action("a-3", ["gpu-0003"]))
    assert "already drained by someone else (bios update)" in o.what and not o.changed
    assert main(["slurm", "resume", "gpu-0003", "n1", "--repaired", "RMA 42: GPU swapped", "--act",
                 "--state", str(state), "--node-map", str(node_map)]) == 0
    out = capsys.readouterr().out
    assert "gpu-0003: drained by someone else (bios update): left alone" in out
    assert "gpu-0001: resumed after repair: RMA 42: GPU swapped" in out
    assert "DRAIN" not in show(slurm, "gpu-0001") and "DRAIN" in show(slurm, "gpu-0002")
    assert "Reason=bios update" in show(slurm, "gpu-0003")
    assert '"note": "RMA 42: GPU swapped"' in state.read_text()
