"""What a stalled job leaves behind: NCCL watchdog timeouts, a py-spy stack sweep, flight recorders.

Each live rank is in one wait state when the job stalls in step k:

- DP_WAIT: finished forward/backward, blocked in the gradient all_reduce (most ranks);
- TP_FWD: a tensor-parallel peer of a culprit, blocked in a forward-pass all_reduce;
- PP_RECV_FWD / PP_RECV_BWD: a pipeline peer downstream / upstream of a culprit, blocked in p2p recv;
- DATA: the data-loader-hang culprit, waiting for a batch (never enqueued step k's collectives);
- PP_WRONG: the pipeline-deadlock culprit, in a broadcast on its pipeline group where
  the peer at the same sequence number waits in a recv (mismatched collectives).

Dead ranks (node loss, the GPU that fell off the bus) leave no dump. Flight-recorder
sequence ids restart with each segment (new process groups); each step issues
`N_TP` tensor-parallel collectives, `N_PP` pipeline p2p ops and one gradient all_reduce.
Pipeline sends and receives are point-to-point, as in PyTorch's recorder: entries
marked `p2p` with their own sequence ids and the `peer` (its index in the pipeline
group, i.e. its stage), so the pipeline group's collective counters stay at -1
unless a rank issues a real collective on it (the deadlock's broadcast). A hang may
have several culprits (`Stop.faults`): each gets its kind's state, and its
neighbours theirs.
"""

from __future__ import annotations

import numpy as np
from gangwatch.producers.simulate.physics import Plan, Segment, Stop
from gangwatch.producers.simulate.placement import GROUP_DESC, rng

DEAD, DP_WAIT, TP_FWD, PP_RECV_FWD, PP_RECV_BWD, DATA, PP_WRONG = range(7)
N_TP, N_PP, N_DP = 64, 16, 1

_OUTER = (
    "train_step (megatron/training/training.py:756)",
    "train (megatron/training/training.py:1238)",
    "pretrain (megatron/training/training.py:361)",
    "<module> (pretrain_gpt.py:227)",
)
_SCHED = "forward_backward_pipelining_without_interleaving (megatron/core/pipeline_parallel/schedules.py:{})"
_FWD_STEP = (
    "forward_step (pretrain_gpt.py:150)",
    "forward_step (megatron/core/pipeline_parallel/schedules.py:275)",
)
_MAIN: dict[int, tuple[str, ...]] = {
    DP_WAIT: (
        "all_reduce (torch/distributed/distributed_c10d.py:2501)",
        "wrapper (torch/distributed/c10d_logger.py:83)",
        "start_grad_sync (megatron/core/distributed/param_and_grad_buffer.py:412)",
        "finish_grad_sync (megatron/core/distributed/distributed_data_parallel.py:297)",
        "finalize_model_grads (megatron/core/distributed/finalize_model_grads.py:212)",
        _SCHED.format(1483),
    ),
    TP_FWD: (
        "all_reduce (torch/distributed/distributed_c10d.py:2501)",
        "wrapper (torch/distributed/c10d_logger.py:83)",
        "_reduce (megatron/core/tensor_parallel/mappings.py:30)",
        "forward (megatron/core/tensor_parallel/mappings.py:234)",
        "apply (torch/autograd/function.py:575)",
        "reduce_from_tensor_model_parallel_region (megatron/core/tensor_parallel/mappings.py:436)",
        "forward (megatron/core/tensor_parallel/layers.py:1034)",
        "_call_impl (torch/nn/modules/module.py:1747)",
        "forward (megatron/core/transformer/attention.py:315)",
        "_call_impl (torch/nn/modules/module.py:1747)",
        "forward (megatron/core/models/gpt/gpt_model.py:264)",
    ) + _FWD_STEP + (_SCHED.format(1362),),
    PP_RECV_FWD: (
        "_communicate (megatron/core/pipeline_parallel/p2p_communication.py:417)",
        "recv_forward (megatron/core/pipeline_parallel/p2p_communication.py:461)",
        _SCHED.format(1355),
    ),
    PP_RECV_BWD: (
        "_communicate (megatron/core/pipeline_parallel/p2p_communication.py:417)",
        "recv_backward (megatron/core/pipeline_parallel/p2p_communication.py:485)",
        _SCHED.format(1452),
    ),
    DATA: (
        "_recv (multiprocessing/connection.py:395)",
        "_recv_bytes (multiprocessing/connection.py:430)",
        "recv_bytes (multiprocessing/connection.py:216)",
        "get (multiprocessing/queues.py:103)",
        "_try_get_data (torch/utils/data/dataloader.py:1133)",
        "_get_data (torch/utils/data/dataloader.py:1294)",
        "_next_data (torch/utils/data/dataloader.py:1332)",
        "__next__ (torch/utils/data/dataloader.py:631)",
        "get_batch (pretrain_gpt.py:98)",
    ) + _FWD_STEP + (_SCHED.format(1362),),
    PP_WRONG: (
        "broadcast (torch/distributed/distributed_c10d.py:2418)",
        "wrapper (torch/distributed/c10d_logger.py:83)",
        "_sync_microbatch_count (megatron/core/pipeline_parallel/schedules.py:1304)",
        _SCHED.format(1341),
    ),
}
_PIN_THREAD = (
    "select (selectors.py:415)",
    "wait (multiprocessing/connection.py:947)",
    "_poll (multiprocessing/connection.py:440)",
    "poll (multiprocessing/connection.py:257)",
    "get (multiprocessing/queues.py:113)",
    "do_one_step (torch/utils/data/_utils/pin_memory.py:37)",
    "_pin_memory_loop (torch/utils/data/_utils/pin_memory.py:60)",
    "run (threading.py:982)",
    "_bootstrap_inner (threading.py:1045)",
    "_bootstrap (threading.py:1002)",
)
# (group kind, op) each wait state is blocked in; None: not in a collective
_BLOCKED = {DP_WAIT: ("dp", "allreduce"), TP_FWD: ("tp", "allreduce"), PP_RECV_FWD: ("pp", "recv"),
            PP_RECV_BWD: ("pp", "recv"), PP_WRONG: ("pp", "broadcast"), DATA: None, DEAD: None}


def wait_states(plan: Plan, seg: Segment, stop: Stop, at: float) -> np.ndarray:
    """Per-rank wait state (see module doc) of a stalled segment, at time `at`."""
    topo = plan.topo
    culprits = np.zeros(topo.n, bool)
    for f in stop.faults:
        culprits[list(f.ranks)] = True
    state = np.full(topo.n, DP_WAIT)
    if plan.sc.peer_states:
        for d in np.unique(topo.dp[culprits]).tolist():
            in_rep = topo.dp == d
            stages = topo.pp[culprits & in_rep]
            lowest = int(stages.min())
            same_stage = np.isin(topo.pp, stages)
            state[in_rep & same_stage] = TP_FWD
            state[in_rep & ~same_stage & (topo.pp > lowest)] = PP_RECV_FWD
            state[in_rep & ~same_stage & (topo.pp < lowest)] = PP_RECV_BWD
    for f in stop.faults:
        if f.kind == "dataloader_hang":
            state[list(f.ranks)] = DATA
        elif f.kind == "pp_deadlock":
            state[list(f.ranks)] = PP_WRONG
            c = f.rank
            if not plan.sc.peer_states and topo.pp[c] + 1 < topo.PP and not culprits[c + topo.TP]:
                state[c + topo.TP] = PP_RECV_FWD  # the peer it deadlocks with
    state[seg.alive_until <= at] = DEAD
    return state


def _progress(state: int, kind: str, done: int, stage: int) -> tuple[int, int, int]:
    """(last_enqueued, last_started, last_completed) of one group of a rank in `state`: collectives, and for
    the pipeline group its point-to-point ops (see `_p2p`: they are not the group's collective counters)."""
    n = {"tp": N_TP, "pp": N_PP, "dp": N_DP}[kind]
    if state == DP_WAIT:
        return (done + 1, done + 1, done) if kind == "dp" else (done + n,) * 3
    if state == TP_FWD:
        if kind == "tp":
            return done + 1, done + 1, done
        return (done + 1,) * 3 if kind == "pp" and stage > 0 else (done,) * 3
    if state == PP_RECV_FWD:
        return (done + 1, done + 1, done) if kind == "pp" else (done,) * 3
    if state in (PP_RECV_BWD, PP_WRONG):
        if kind == "tp":  # upstream peers ran their forward; the culprit broadcast before it
            return (done + n // 2,) * 3 if state == PP_RECV_BWD else (done,) * 3
        if kind == "pp":
            return (done + 2, done + 2, done + 1) if state == PP_RECV_BWD else (done + 1, done + 1, done)
        return (done,) * 3
    return (done,) * 3  # DATA: nothing of step k enqueued


_OPS = {"tp": "allreduce", "dp": "allreduce", "pp": "send"}


def _p2p(state: int, done: int, stage: int, n_stages: int) -> list[dict]:
    """The pipeline group's point-to-point entries of a rank in `state` (seq: per-rank p2p ids, `peer`: the
    other stage): its last completed one, and the receive it is blocked in, if any."""
    enq, _, comp = _progress(state, "pp", done, stage)
    out = []
    if comp > 0:
        peer = stage + 1 if stage + 1 < n_stages else stage - 1
        out.append({"seq": comp, "op": "send" if stage + 1 < n_stages else "recv", "state": "completed",
                    "p2p": True, "peer": peer})
    if state in (PP_RECV_FWD, PP_RECV_BWD) and enq > comp:
        peer = stage - 1 if state == PP_RECV_FWD else stage + 1
        out.append({"seq": enq, "op": "recv", "state": "started", "p2p": True, "peer": peer})
    return out


def _entries(state: int, groups: list[dict], kinds: list[str], done_pp: int, stage: int, n_stages: int) -> list[dict]:
    out = []
    for g, kind in zip(groups, kinds, strict=True):
        if kind == "pp":
            out += [{**e, "pg": g["pg"]} for e in _p2p(state, done_pp, stage, n_stages)]
            if state == PP_WRONG:  # a collective on the pipeline group that no other stage calls
                out.append({"seq": 0, "op": "broadcast", "pg": g["pg"], "state": "started"})
            continue
        enq, _, comp = g["last_enqueued"], g["last_started"], g["last_completed"]
        if comp > 0:
            out.append({"seq": comp, "op": _OPS[kind], "pg": g["pg"], "state": "completed"})
        if enq > comp:
            blocked = _BLOCKED[state]
            op = blocked[1] if blocked and blocked[0] == kind else _OPS[kind]
            out.append({"seq": enq, "op": op, "pg": g["pg"], "state": "started"})
    return out


def stall_records(plan: Plan, seg: Segment, stop: Stop) -> list[tuple[float, dict]]:
    """framework (nccl_timeout, exception, exit), stack and flight records of a stalled segment."""
    sc, topo, f = plan.sc, plan.topo, stop.fault
    job, R = sc.job_id, topo.n
    r = rng(sc.seed, "stall", seg.index)
    out: list[tuple[float, dict]] = []
    k = stop.step
    done = {kind: (k - seg.step0) * n for kind, n in (("tp", N_TP), ("pp", N_PP), ("dp", N_DP))}
    pids = 4000 + rng(sc.seed, "pids", seg.index).integers(0, 60000, R)
    if f.kind == "xid79":
        ts = f.ts + float(f.param("exception_after_s", 1.5))
        out.append((ts, {"kind": "framework", "v": 1, "ts": round(ts, 6), "job": job, "rank": f.rank,
                         "type": "exception", "message": (
                             "RuntimeError: CUDA error: unspecified launch failure\nCUDA kernel errors might be "
                             "asynchronously reported at some other API call, so the stacktrace below might be "
                             "incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1.")}))
    # NCCL watchdog timeouts: most ranks blocked in a collective report within seconds, naming random peers
    tstate = wait_states(plan, seg, stop, f.ts + sc.nccl_timeout_s)
    arrive = stop.arrive if stop.arrive is not None else np.zeros(R)
    began = stop.step_start + np.where(tstate == DP_WAIT, arrive, 0.1 * arrive)
    t_out = np.maximum(began, f.ts) + sc.nccl_timeout_s + r.uniform(0.2, 3.0, R)
    report = r.random(R) < 0.9
    peer_pick = r.random(R)
    for rank in np.flatnonzero(report).tolist():
        st = int(tstate[rank])
        blocked = _BLOCKED[st]
        if blocked is None or t_out[rank] >= seg.alive_until[rank]:
            continue
        kind, op = blocked
        peers = [p for p in topo.members(kind, rank) if p != rank] or [p for p in range(R) if p != rank] or [rank]
        peer = peers[int(peer_pick[rank] * len(peers))]
        seq = _progress(st, kind, done[kind], int(topo.pp[rank]))[0]
        ms = int(sc.nccl_timeout_s * 1000)
        ts = float(t_out[rank])
        out.append((ts, {
            "kind": "framework", "v": 1, "ts": round(ts, 6), "job": job, "rank": rank, "type": "nccl_timeout",
            "op": op, "seq": seq, "pg": kind, "peer": peer,
            "message": (f"[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, "
                        f"OpType={op.upper()}, NumelIn=25165824, NumelOut=25165824, Timeout(ms)={ms}) ran for "
                        f"{ms + int((ts - began[rank] - sc.nccl_timeout_s) * 1000)} milliseconds before "
                        f"timing out.")}))
    if sc.abort_on_timeout:
        for rank in range(R):
            until = float(seg.alive_until[rank])
            if until < seg.t_end and not (f.kind == "node_loss" and rank in f.ranks) and not (
                    f.kind == "xid79" and rank == f.rank):
                out.append((until - 0.1, {"kind": "framework", "v": 1, "ts": round(until - 0.1, 6), "job": job,
                                          "rank": rank, "type": "exit",
                                          "message": "process exited with signal SIGABRT (NCCL watchdog)"}))
    if sc.sweep_after_s is not None:
        out += _sweep(plan, seg, stop, pids, done, r)
    return out


def _sweep(plan: Plan, seg: Segment, stop: Stop, pids: np.ndarray, done: dict, r) -> list[tuple[float, dict]]:
    sc, topo = plan.sc, plan.topo
    job = sc.job_id
    at = stop.fault.ts + float(sc.sweep_after_s)
    if at >= seg.t_end:
        return []
    state = wait_states(plan, seg, stop, at)
    snapshot = f"s-{seg.index:02d}{int(at) % 10000:04d}"
    t_dump = at + r.uniform(0.0, 2.5, topo.n)
    tids = r.integers(0x7F0000000000, 0x7FFFFFFFF000, size=(topo.n, 2)) & ~0xFFF
    cmd = (f"/usr/bin/python3 -u pretrain_gpt.py --tensor-model-parallel-size {topo.TP} "
           f"--pipeline-model-parallel-size {topo.PP}")
    out: list[tuple[float, dict]] = []
    kinds_all = [k for k in ("tp", "pp", "dp") if topo.group_size(k) > 1]
    for rank in range(topo.n):
        st = int(state[rank])
        ts = float(t_dump[rank])
        if st == DEAD or ts >= seg.alive_until[rank]:
            continue
        main = "\n".join("    " + fr for fr in _MAIN[st] + _OUTER)
        pin = "\n".join("    " + fr for fr in _PIN_THREAD)
        dump = (f"Process {int(pids[rank])}: {cmd}\nPython v3.10.12 (/usr/bin/python3.10)\n\n"
                f"Thread 0x{int(tids[rank, 0]):X} ({'idle' if st == DATA else 'active'}): \"MainThread\"\n{main}\n"
                f"Thread 0x{int(tids[rank, 1]):X} (idle): \"Thread-3 (_pin_memory_loop)\"\n{pin}\n")
        out.append((ts, {"kind": "stack", "v": 1, "ts": round(ts, 6), "job": job, "rank": rank,
                         "snapshot": snapshot, "format": "py-spy", "dump": dump}))
        stage = int(topo.pp[rank])
        groups = []
        for kind in kinds_all:
            enq, started, comp = _progress(st, kind, done[kind], stage)
            if kind == "pp":  # only point-to-point ops there: no collective yet, but the deadlock's broadcast
                enq, started, comp = (0, 0, -1) if st == PP_WRONG else (-1, -1, -1)
            groups.append({"pg": topo.pg(kind, rank), "desc": GROUP_DESC[kind], "ranks": topo.members(kind, rank),
                           "last_enqueued": enq, "last_started": started, "last_completed": comp})
        fts = ts + 0.05
        entries = _entries(st, groups, kinds_all, done["pp"], stage, topo.PP)
        out.append((fts, {"kind": "flight", "v": 1, "ts": round(fts, 6), "job": job, "rank": rank,
                          "snapshot": snapshot, "groups": groups, "entries": entries}))
    return out
