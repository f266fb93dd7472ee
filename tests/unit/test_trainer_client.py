"""The trainer client without Kafka and without real time: what it sends, how it times, how it copes.

Most tests run the client with `background=False` (no threads: `flush()` runs a
sending cycle on the test's thread), a recording `send`, and a fake clock that
moves only when told; the last ones run the real threads.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from gangwatch.producers.simulate.placement import Topology as SimTopology
from gangwatch.producers.trainer import TrainerClient
from gangwatch.producers.trainer.jobrecord import coordinates, job_record
from gangwatch.producers.trainer.launch import Launch, job_id
from gangwatch.producers.trainer.sections import EventPool
from gangwatch.schemas import Framework, Heartbeat, Job, Step, decode

from tests.helpers import need_module
from tests.unit.trainercases import T0, FakeTime, Recorder, fake_clients  # noqa: F401 - fake_clients: `fake`

pytestmark = pytest.mark.unit

# --- records on the wire ---------------------------------------------------------------------


def test_rank0_announces_the_job_and_every_record_is_contract_v1_keyed_by_job(fake):
    client, send, ft = fake(rank=0, world_size=8, local_world_size=4, tp=2, pp=2, nodes=["a", "b"])
    ft.advance(1.0)
    client.step(0, loss=2.5, grad_norm=0.7, replica_digest="abcd")
    client.event("oom", "CUDA out of memory")
    client.flush()
    assert {(t, k) for t, k, _ in send.msgs} == {("gw.jobs", b"j1"), ("gw.telemetry", b"j1")}
    [job] = send.records("gw.jobs")
    assert isinstance(job, Job) and job.heartbeat_s == 5.0
    assert [(r.rank, r.node, r.gpu, r.tp, r.pp, r.dp) for r in job.ranks] == [
        (0, "a", 0, 0, 0, 0), (1, "a", 1, 1, 0, 0), (2, "a", 2, 0, 0, 1), (3, "a", 3, 1, 0, 1),
        (4, "b", 0, 0, 1, 0), (5, "b", 1, 1, 1, 0), (6, "b", 2, 0, 1, 1), (7, "b", 3, 1, 1, 1)]
    hb, step, event = send.records("gw.telemetry")
    assert isinstance(hb, Heartbeat) and hb.step is None  # the first heartbeat goes out before any step
    assert isinstance(step, Step) and (step.step, step.loss, step.grad_norm, step.replica_digest) == (0, 2.5, 0.7,
                                                                                                     "abcd")
    assert isinstance(event, Framework) and (event.type, event.message) == ("oom", "CUDA out of memory")
    assert step.ts == T0 + 1.0


def test_only_rank0_announces(fake):
    client, send, _ = fake(rank=3, world_size=4)
    client.flush()
    assert [r.kind for r in send.records()] == ["heartbeat"]


def test_one_batch_message_per_topic_per_flush(fake):
    client, send, ft = fake(batch_max=4)
    for k in range(10):
        ft.advance(0.1)
        client.step(k)
    client.flush()
    telemetry = [v for t, _, v in send.msgs if t == "gw.telemetry"]
    assert [len(decode(v)) for v in telemetry] == [4, 4, 3]  # a heartbeat and 10 steps, 4 per message
    assert all(v.startswith(b'{"kind":"batch"') for v in telemetry)
    assert [s.step for s in send.steps()] == list(range(10))


# --- timing ---------------------------------------------------------------------------------------


def test_sections_add_up_within_a_step_and_step_s_runs_from_the_previous_step_end(fake):
    client, send, ft = fake()
    ft.advance(7.0)  # model loading: not part of any step
    for k in range(2):
        ft.advance(0.25)  # the loader
        with client.step_context(k) as s:
            with client.section("compute"):
                ft.advance(0.5)
            with client.section("comm_wait"):
                ft.advance(0.125)
            with client.section("compute"):  # a second block of the same name adds up
                ft.advance(0.5)
            with client.section("optimizer"):  # a name of its own goes to the extra fields
                ft.advance(0.0625)
            s.loss = 3.0 - k
    client.flush()
    first, second = send.steps()
    assert (first.compute_s, first.comm_wait_s, first.extra["optimizer_s"]) == (1.0, 0.125, 0.0625)
    assert first.data_wait_s is None and first.step_s == 1.1875  # the first step runs from its start
    assert second.data_wait_s == 0.25 and second.step_s == 1.4375  # from the end of the first
    assert (first.loss, second.loss) == (3.0, 2.0)


def test_a_step_whose_body_raises_is_not_reported(fake):
    client, send, ft = fake()
    with pytest.raises(RuntimeError), client.step_context(0):
        raise RuntimeError("boom")
    client.flush()
    assert send.steps() == []


class Scalar:
    """A one-element tensor look-alike: detached by step(), read with float() on the sending thread."""

    def __init__(self, v: float) -> None:
        self.v, self.detached, self.read = v, False, False

    def detach(self) -> Scalar:
        self.detached = True
        return self

    def __float__(self) -> float:
        self.read = True
        return self.v


def test_tensor_values_are_detached_at_once_and_read_only_when_sending(fake):
    client, send, _ = fake()
    loss = Scalar(1.25)
    client.step(0, loss=loss)
    assert loss.detached and not loss.read
    client.flush()
    assert loss.read and send.steps()[0].loss == 1.25


class FakeEvent:
    """A CUDA event look-alike: the 'GPU' reaches it when the test says so."""

    gpu_time = 0.0

    def __init__(self) -> None:
        self.at: float | None = None
        self.done = False

    def record(self) -> None:
        self.at = FakeEvent.gpu_time

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.at - self.at) * 1000.0  # milliseconds, like torch


def test_cuda_sections_are_resolved_by_the_sender_once_the_gpu_got_there(fake):
    client, send, ft = fake()
    made: list[FakeEvent] = []

    def new_event() -> FakeEvent:
        made.append(FakeEvent())
        return made[-1]

    client._events = EventPool(make=new_event)  # what cuda=True sets up, with events that need no GPU

    def one_step(k: int) -> None:
        with client.step_context(k):
            with client.section("compute"):
                FakeEvent.gpu_time += 0.75  # GPU work, launched: no host time passes
            with client.section("data_wait"):  # host-side, on the wall clock even with CUDA timing
                ft.advance(0.1)

    one_step(0)
    one_step(1)
    client.flush()
    assert send.steps() == []  # nothing synchronized, nothing resolved: the GPU is still behind
    made[1].done = True  # the GPU reached the end of step 0's compute
    client.flush()
    assert [(s.step, s.compute_s, s.data_wait_s) for s in send.steps()] == [(0, 0.75, 0.1)]
    one_step(2)
    assert len(made) == 4  # step 2 reused step 0's events, given back once resolved
    client.close()  # closing waits for the GPU
    assert [(s.step, s.compute_s) for s in send.steps()] == [(0, 0.75), (1, 0.75), (2, 0.75)]


# --- never holding up training ----------------------------------------------------------------------


def test_a_full_queue_drops_the_oldest_steps_and_the_next_heartbeat_says_how_many(fake):
    client, send, _ = fake(queue_max=3)
    for k in range(5):
        client.step(k)
    client.heartbeat()
    client.flush()
    assert [s.step for s in send.steps()] == [2, 3, 4]
    hbs = [r for r in send.records() if r.kind == "heartbeat"]
    assert hbs[0].extra == {} and hbs[-1].extra == {"dropped": 2} and hbs[-1].step == 4


def test_heartbeats_are_never_dropped(fake):
    client, send, _ = fake(queue_max=1)
    for _ in range(50):
        client.heartbeat()
        client.step(0)
    client.flush()
    assert sum(r.kind == "heartbeat" for r in send.records()) == 51


def test_while_the_broker_is_away_records_spool_and_go_out_in_order_when_it_returns(fake, tmp_path):
    client, send, ft = fake(spool_dir=tmp_path / "s")
    send.fail = True
    for k in range(6):
        ft.advance(6.0)  # past any back-off (it doubles from 0.5 s up to 5 s)
        client.step(k)
        client.flush()
    assert send.msgs == [] and list((tmp_path / "s").glob("*.spool"))
    calls = send.calls
    client.step(6)
    client.flush()  # within the back-off: no new attempt, straight to the spool
    assert send.calls == calls
    send.fail = False
    ft.advance(60.0)
    client.step(7)
    client.flush()
    assert [s.step for s in send.steps()] == list(range(8))
    assert [r.kind for r in send.records("gw.jobs")] == ["job"]
    assert not list((tmp_path / "s").glob("*.spool"))  # all sent: the spool is empty
    assert client.dropped == 0


def test_a_spool_left_by_a_previous_process_is_sent_first(fake, tmp_path):
    first, dead_send, _ = fake(spool_dir=tmp_path / "s")
    dead_send.fail = True
    first.step(0)
    first.close()  # the broker never came back while it ran
    second, send, _ = fake(spool_dir=tmp_path / "s")
    second.step(1)
    second.flush()
    assert [s.step for s in send.steps()] == [0, 1]


def test_the_spool_is_bounded_and_gives_up_the_oldest_records(fake, tmp_path):
    client, send, ft = fake(spool_dir=tmp_path / "s", spool_bytes=8192)
    send.fail = True
    for k in range(200):
        client.step(k, note="x" * 100)
        client.flush()
    spooled = sum(p.stat().st_size for p in (tmp_path / "s").glob("*.spool"))
    assert spooled <= 8192 + 4096 and client.dropped > 0
    send.fail = False
    ft.advance(60.0)
    client.flush()
    steps = [s.step for s in send.steps()]
    assert steps == list(range(200 - len(steps), 200))  # the newest survive, in order
    assert len(steps) + client.dropped == 200 + 2  # (the first heartbeat and the job record were oldest)


def test_records_that_cannot_be_encoded_are_counted_not_raised(fake):
    client, send, _ = fake()
    client.flush()
    client.step(0, note=object())
    client.step(1)
    client.flush()
    assert send.steps() == [] and client.dropped == 2  # the batch that held them is lost, and said so
    client.step(2)
    client.flush()
    assert [s.step for s in send.steps()] == [2]


# --- process exit --------------------------------------------------------------------------------------


def test_an_uncaught_exception_is_reported_then_passed_to_the_previous_hook(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda *a: seen.append(a[0]))
    send = Recorder()
    client = TrainerClient(job="j1", rank=2, world_size=4, send=send, background=False, spool_dir=tmp_path)
    try:
        raise ValueError("loss is NaN")
    except ValueError:
        sys.excepthook(*sys.exc_info())
    assert seen == [ValueError]
    client.close()
    assert sys.excepthook is not client._hook  # closing puts the previous hook back
    [exc] = [r for r in send.records() if r.kind == "framework"]
    assert (exc.type, exc.message, exc.rank) == ("exception", "ValueError: loss is NaN", 2)


def test_a_clean_close_says_the_rank_finished(tmp_path):
    send = Recorder()
    client = TrainerClient(job="j1", rank=1, world_size=4, send=send, background=False, spool_dir=tmp_path)
    client.step(0)
    client.close()
    [done] = [r for r in send.records() if r.kind == "framework"]
    assert (done.type, done.extra.get("code"), done.rank) == ("exit", 0, 1)


def test_an_event_with_an_undeclared_field_carries_it_in_extra(tmp_path):
    send = Recorder()
    client = TrainerClient(job="j1", rank=0, world_size=1, send=send, background=False, spool_dir=tmp_path)
    client.event("exit", "done", code=3, op="allreduce")
    client.close()
    first = [r for r in send.records() if r.kind == "framework"][0]
    assert (first.type, first.op, first.extra.get("code")) == ("exit", "allreduce", 3)


def test_a_crashing_script_reports_the_exception_and_flushes_at_exit(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import orjson, sys\n"
        "from gangwatch.producers.trainer import TrainerClient\n"
        f"out = open({str(tmp_path / 'sent.jsonl')!r}, 'ab')\n"
        "client = TrainerClient(job='j9', send=lambda t, k, v: out.write(v + b'\\n') and out.flush(),\n"
        f"                       spool_dir={str(tmp_path / 'spool')!r})\n"
        "for k in range(3):\n"
        "    client.step(k)\n"
        "raise RuntimeError('CUDA error: an illegal memory access was encountered')\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "RuntimeError" in proc.stderr  # the traceback still prints
    recs = [r for line in (tmp_path / "sent.jsonl").read_bytes().splitlines() for r in decode(line)]
    assert [r.step for r in recs if r.kind == "step"] == [0, 1, 2]
    [exc] = [r for r in recs if r.kind == "framework"]
    assert exc.type == "exception" and "illegal memory access" in exc.message


# --- the real threads --------------------------------------------------------------------------------------


def test_heartbeats_come_from_their_own_thread_while_the_training_thread_is_busy(tmp_path):
    send = Recorder()
    client = TrainerClient(job="j1", send=send, heartbeat_s=0.05, flush_s=0.02, spool_dir=tmp_path,
                           exit_hooks=False)
    client.step(0)
    time.sleep(0.4)  # one long step: no call into the client
    assert client.flush(timeout_s=5)
    client.close()
    hbs = [r for r in send.records() if r.kind == "heartbeat"]
    assert len(hbs) >= 4 and hbs[-1].step == 0
    assert [s.step for s in send.steps()] == [0]


def test_a_broker_that_hangs_never_blocks_the_training_thread(tmp_path):
    """Every step, and close, return while the broker still holds the first send (how long a step takes with
    the client on, and with a broker that hangs: bench/bench_trainer.py)."""
    entered, release, gave_up = threading.Event(), threading.Event(), threading.Event()

    def stuck(topic: str, key: bytes, value: bytes) -> None:
        entered.set()
        if not release.wait(60):
            gave_up.set()  # a training thread that waited on the broker would only go on from here
        raise TimeoutError("no answer")

    client = TrainerClient(job="j1", send=stuck, flush_s=0.01, spool_dir=tmp_path, exit_hooks=False)

    def train() -> None:
        client.step(0)
        assert entered.wait(10)  # the sending thread is stuck in the broker ...
        for k in range(1, 2000):  # ... while the training thread steps on
            client.step(k)
        client.close(timeout_s=0.5)

    loop = threading.Thread(target=train, daemon=True)
    loop.start()
    loop.join(30)  # a deadline only: stepping on takes milliseconds, the broker holds the send for 60 s
    try:
        assert not loop.is_alive(), "the training thread is waiting (on the broker?)"
        assert entered.is_set() and not gave_up.is_set()  # all of it returned while the broker still held the send
    finally:
        release.set()


# --- where the process runs --------------------------------------------------------------------------------


def test_the_launcher_environment_and_its_overrides():
    env = {"RANK": "13", "LOCAL_RANK": "5", "WORLD_SIZE": "32", "LOCAL_WORLD_SIZE": "8",
           "TORCHELASTIC_RUN_ID": "run-7", "SLURM_JOB_ID": "991", "SLURMD_NODENAME": "gpu-017",
           "GANGWATCH_BOOTSTRAP": "k1:9092", "GANGWATCH_TOPIC_PREFIX": "prod."}
    got = Launch.from_env(env)
    assert (got.job, got.rank, got.world_size, got.local_rank, got.local_world_size, got.node) == (
        "run-7", 13, 32, 5, 8, "gpu-017")
    assert got.bootstrap == "k1:9092" and got.topics.telemetry == "prod.telemetry"
    assert Launch.from_env({**env, "GANGWATCH_NODE": "n1"}, rank=3).node == "n1"
    assert Launch.from_env(env, rank=3, job="mine").rank == 3
    assert Launch.from_env({}).topics.jobs == "gw.jobs"


def test_the_job_id_every_rank_agrees_on():
    assert job_id({"GANGWATCH_JOB": "a", "TORCHELASTIC_RUN_ID": "b"}, "n") == "a"
    assert job_id({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "77"}, "n") == "77"
    assert job_id({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "h0", "MASTER_PORT": "29500"}, "n") == "h0:29500"
    assert job_id({}, "n").startswith("n-")


@pytest.mark.parametrize("tp,pp,dp", [(2, 2, 2), (4, 1, 3), (1, 3, 2), (8, 4, 4)])
def test_rank_order_tp_pp_dp_is_the_simulators(tp, pp, dp):
    sim = SimTopology(tp, pp, dp, gpus_per_node=tp)
    for r in range(tp * pp * dp):
        assert coordinates(r, tp, pp, dp, "tp-pp-dp") == (sim.tp[r], sim.pp[r], sim.dp[r])


def test_rank_order_tp_dp_pp_puts_the_pipeline_stage_outermost():
    tp, pp, dp = 2, 3, 4
    coords = [coordinates(r, tp, pp, dp) for r in range(tp * pp * dp)]
    assert sorted(coords) == sorted({(t, p, d) for t in range(tp) for p in range(pp) for d in range(dp)})
    assert [c[1] for c in coords] == [r // (tp * dp) for r in range(tp * pp * dp)]
    assert coords[:4] == [(0, 0, 0), (1, 0, 0), (0, 0, 1), (1, 0, 1)]
    with pytest.raises(ValueError, match="rank order"):
        coordinates(0, 1, 1, 1, "pp-tp-dp")


def test_nodes_per_rank_per_node_or_assumed_in_blocks():
    launch = Launch(job="j", rank=5, world_size=8, local_rank=1, local_world_size=4, node="me", bootstrap=None,
                    topic_prefix="gw.")

    def nodes(**kw):
        return [(r.node, r.gpu) for r in job_record(launch, T0, 5.0, **kw).ranks]

    assert nodes(nodes=["a", "b"]) == [("a", 0), ("a", 1), ("a", 2), ("a", 3), ("b", 0), ("b", 1), ("b", 2), ("b", 3)]
    assert [n for n, _ in nodes(nodes=list("abcdefgh"))] == list("abcdefgh")
    assert [n for n, _ in nodes()] == ["node0"] * 4 + ["me"] * 4  # this rank's block is on this host
    assert {g for _, g in nodes(gpus=False)} == {None}
    with pytest.raises(ValueError, match="one per rank"):
        nodes(nodes=["a", "b", "c"])
    with pytest.raises(ValueError, match="multiple of tp x pp"):
        nodes(tp=3)


def test_importing_the_client_pulls_in_no_optional_dependency():
    code = ("import sys, gangwatch.producers.trainer\n"
            "print(sorted(m for m in ('numpy', 'torch', 'faust', 'chdb', 'sklearn', 'kafka', 'gangwatch.streams')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.gpu
def test_cuda_timing_on_a_real_gpu_never_waits_for_the_gpu(tmp_path):
    torch = need_module("torch", "the `torch` extra")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    send = Recorder()
    client = TrainerClient(job="j1", send=send, cuda=True, background=False, exit_hooks=False, spool_dir=tmp_path)
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    for k in range(3):
        with client.step_context(k), client.section("compute"):
            for _ in range(50):
                a = torch.tanh(a @ a)  # tens of milliseconds of GPU work, launched in microseconds
        assert not torch.cuda.current_stream().query()  # the step is reported while the GPU still works on it
    client.flush()
    client.close()  # closing waits for the GPU
    steps = send.steps()
    assert [s.step for s in steps] == [0, 1, 2]
    assert all(s.compute_s > 0.005 for s in steps)
