"""The ordinary life of a rank through the trainer client: known pauses (a checkpoint save) and stops on purpose
(SIGTERM, SIGINT), in-process with a recording `send` and, for signals, in a real Python process."""

from __future__ import annotations

import select
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from gangwatch.producers.trainer import TrainerClient
from gangwatch.schemas import Lifecycle, decode

from tests.unit.trainercases import Recorder, fake_clients  # noqa: F401 - fake_clients: the `fake` fixture

pytestmark = pytest.mark.unit


# --- the ordinary life of a rank: known pauses, stops on purpose ------------------------------------------


def lifecycle(send: Recorder) -> list[tuple[str, int | None, str | None, str | None]]:
    return [(r.event, r.rank, r.reason, r.source) for r in send.records() if r.kind == "lifecycle"]


def test_a_pause_brackets_a_checkpoint_save_with_pause_and_resume(fake):
    client, send, ft = fake(rank=3, world_size=4)
    ft.advance(1.0)
    client.step(0)
    with client.pause("checkpoint"):
        ft.advance(30.0)  # the save
        client.heartbeat()  # (the heartbeat thread's beat, in a test without threads)
    client.step(1)
    client.flush()
    assert lifecycle(send) == [("pause", 3, "checkpoint", "trainer"), ("resume", 3, "checkpoint", "trainer")]
    recs = [r for r in send.records() if r.kind in ("lifecycle", "heartbeat")]
    pause, resume = [r for r in recs if r.kind == "lifecycle"]
    assert resume.ts - pause.ts == 30.0
    assert [r.kind for r in recs if pause.ts <= r.ts <= resume.ts] == ["lifecycle", "heartbeat", "lifecycle"]


def test_a_pause_whose_body_raises_still_resumes_and_a_pause_not_entered_sends_nothing(fake):
    client, send, _ = fake()
    client.pause("eval")  # not entered: nothing is said
    with pytest.raises(OSError):
        with client.pause("checkpoint"):
            raise OSError("disk full")
    client.flush()
    assert [e for e, *_ in lifecycle(send)] == ["pause", "resume"]


def test_heartbeats_go_on_from_their_thread_during_a_pause(tmp_path):
    send = Recorder()
    client = TrainerClient(job="j1", send=send, heartbeat_s=0.05, flush_s=0.02, spool_dir=tmp_path,
                           exit_hooks=False)
    try:
        with client.pause("checkpoint"):
            paused = time.time()
            deadline = time.monotonic() + 10
            while not [r for r in send.records() if r.kind == "heartbeat" and r.ts > paused]:
                assert time.monotonic() < deadline, "no heartbeat while paused"
                time.sleep(0.02)
    finally:
        client.close()
    assert [e for e, *_ in lifecycle(send)] == ["pause", "resume"]


STOPPED = (
    "import os, signal, sys, time\n"
    # Ctrl-C raises KeyboardInterrupt, as in a terminal, even where the tests run as a background job (which
    # starts every process with SIGINT ignored: the client would rightly leave it ignored)
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "{head}"
    "from gangwatch.producers.trainer import TrainerClient\n"
    "out = open(sys.argv[1], 'ab')\n"
    "def send(t, k, v):\n"
    "    out.write(v + b'\\n'); out.flush()\n"
    "{on_send}"
    "client = TrainerClient(job='j9', rank=1, world_size=2, send=send, spool_dir=sys.argv[2])\n"
    "client.step(0)\n"
    "{body}"
)
READY = "print('ready', flush=True)\n"  # the body says it once the signal may come (inside its try, if any)


def _stopped_by(tmp_path, sig: int, body: str = READY + "time.sleep(60)\n", *, head: str = "",
                on_send: str = "") -> tuple[subprocess.CompletedProcess, list]:
    """Run STOPPED (`head`: lines before the client is made; `on_send`: lines of `send`, after it wrote `v`),
    send `sig` once it is ready, and return how it ended and what it sent."""
    script = tmp_path / "train.py"
    script.write_text(STOPPED.format(body=body, head=head, on_send=on_send))
    sent = tmp_path / "sent.jsonl"
    proc = subprocess.Popen([sys.executable, str(script), str(sent), str(tmp_path / "spool")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"  # the client and its hooks are in place
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    recs = [r for line in sent.read_bytes().splitlines() for r in decode(line)] if sent.exists() else []
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), recs


def test_sigterm_sends_a_stop_then_the_process_still_dies_by_sigterm(tmp_path):
    proc, recs = _stopped_by(tmp_path, signal.SIGTERM)
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    [stop] = [r for r in recs if isinstance(r, Lifecycle)]
    assert (stop.event, stop.rank, stop.reason, stop.source, stop.job) == ("stop", 1, "SIGTERM", "trainer", "j9")
    assert [r.type for r in recs if r.kind == "framework"] == []  # neither a crash nor a clean exit


def test_sigint_sends_a_stop_and_still_raises_keyboard_interrupt(tmp_path):
    body = (f"try:\n    {READY}    time.sleep(60)\n"  # ready inside the try: the signal may not come before it
            "except KeyboardInterrupt:\n    print('interrupted', flush=True)\n    raise\n")
    proc, recs = _stopped_by(tmp_path, signal.SIGINT, body)
    assert "interrupted" in proc.stdout and "KeyboardInterrupt" in proc.stderr
    assert proc.returncode != 0
    assert [(r.event, r.reason) for r in recs if isinstance(r, Lifecycle)] == [("stop", "SIGINT")]
    assert [r.type for r in recs if r.kind == "framework"] == []  # Ctrl-C is no exception to report


def test_a_previous_sigterm_handler_is_still_called_after_the_stop(tmp_path):
    mine = "signal.signal(signal.SIGTERM, lambda s, f: (print('mine', flush=True), sys.exit(7)))\n"
    proc, recs = _stopped_by(tmp_path, signal.SIGTERM, head=mine)
    assert proc.returncode == 7 and "mine" in proc.stdout, proc.stderr
    assert [(r.event, r.reason) for r in recs if isinstance(r, Lifecycle)] == [("stop", "SIGTERM")]
    assert [r.type for r in recs if r.kind == "framework"] == []  # the stop said it: no `exit` at close


def test_a_forked_child_that_gets_sigterm_says_nothing_and_dies_by_it(tmp_path):
    body = ("import signal\n"
            "pid = os.fork()\n"
            "if pid == 0:  # a DataLoader worker, say: it inherits the hooks, not the client\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    os._exit(3)\n"
            "_, status = os.waitpid(pid, 0)\n"
            "print('child', os.WIFSIGNALED(status) and os.WTERMSIG(status), flush=True)\n"
            "client.close()\n")
    script = tmp_path / "train.py"
    script.write_text(STOPPED.format(body=body, head="", on_send="")
                      .replace("spool_dir=sys.argv[2])", "spool_dir=sys.argv[2], background=False)"))
    sent = tmp_path / "sent.jsonl"
    proc = subprocess.run([sys.executable, str(script), str(sent), str(tmp_path / "spool")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and f"child {int(signal.SIGTERM)}" in proc.stdout, proc.stderr
    recs = [r for line in sent.read_bytes().splitlines() for r in decode(line)]
    assert [r for r in recs if isinstance(r, Lifecycle)] == []  # the parent was never stopped
    assert [(r.type, r.extra.get("code")) for r in recs if r.kind == "framework"] == [("exit", 0)]


@pytest.fixture(name="no_wakeup_fd")
def free_wakeup_fd():
    """The test process's signal wakeup fd put aside for the test (a client another test left open may hold it)
    and put back after."""
    held = signal.set_wakeup_fd(-1)
    yield
    signal.set_wakeup_fd(held)


def wakeup_fd() -> int:
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    return fd


def test_signal_hooks_can_be_turned_off_and_are_removed_at_close(tmp_path, no_wakeup_fd):
    before = signal.getsignal(signal.SIGTERM)
    client = TrainerClient(job="j1", send=Recorder(), background=False, spool_dir=tmp_path, signal_hooks=False)
    assert signal.getsignal(signal.SIGTERM) is before and wakeup_fd() == -1
    client.close()
    client = TrainerClient(job="j1", send=Recorder(), background=False, spool_dir=tmp_path)
    assert signal.getsignal(signal.SIGTERM) == client._on_signal
    watch = client._signal_watch
    assert watch.thread.is_alive() and watch.thread.name == "gangwatch-signals" and wakeup_fd() != -1
    client.close()
    assert signal.getsignal(signal.SIGTERM) is before
    assert wakeup_fd() == -1 and not watch.thread.is_alive()  # the wakeup fd given back, its thread ended
    made = []
    t = threading.Thread(target=lambda: made.append(TrainerClient(job="j1", send=Recorder(), background=False,
                                                                  spool_dir=tmp_path)))
    t.start()
    t.join()
    assert signal.getsignal(signal.SIGTERM) is before  # off the main thread: no hooks, and no error
    made[0].close()


def test_a_signal_that_comes_while_the_training_thread_holds_the_clients_wake_lock_still_stops(tmp_path):
    """A step (with the relay), an event or a pause wakes the sending thread through a `threading.Event`, whose
    lock is not reentrant: a signal handled inside that `set()` must not take the same lock on the same thread
    (it hung for good). Here the training thread holds the lock when Ctrl-C comes: the handler still hands the
    signal on within `signal_flush_s`, and the stop goes out once the lock is let go."""
    body = ("try:\n"
            "    with client._wake._cond:  # as inside Event.set() from client.step()\n"
            f"        {READY}        time.sleep(60)\n"
            "except KeyboardInterrupt:\n    print('interrupted', flush=True)\n    raise\n")
    started = time.monotonic()
    proc, recs = _stopped_by(tmp_path, signal.SIGINT, body)
    assert "interrupted" in proc.stdout, proc.stderr
    assert time.monotonic() - started < 30  # signal_flush_s (2 s) and the close, not the 60 s sleep
    assert [(r.event, r.reason) for r in recs if isinstance(r, Lifecycle)] == [("stop", "SIGINT")]


def test_another_handler_raising_while_the_stop_is_said_does_not_turn_the_stop_into_a_crash(tmp_path):
    """torchrun's SIGTERM goes to the whole process group: a DataLoader worker dies of it too, and PyTorch's SIGCHLD
    handler raises "DataLoader worker ... is killed by signal" in the rank while its stop is being said (a real
    run: exit code 1 and an `exception` record, read as a software crash). Here SIGUSR1's handler raises at that
    moment (the sending thread sends it on seeing the `stop`): the process still dies by SIGTERM, as it would
    without the hook, and reports no exception."""
    worker_died = ("def worker_died(signum, frame):\n"
                   "    raise RuntimeError('DataLoader worker (pid 1) is killed by signal: Terminated.')\n"
                   "signal.signal(signal.SIGUSR1, worker_died)\n")
    on_send = ("    if b'\"stop\"' in v:\n"
               "        os.kill(os.getpid(), signal.SIGUSR1)\n"
               "        time.sleep(0.5)  # the main thread, waiting for the stop to be said, runs the handler\n")
    proc, recs = _stopped_by(tmp_path, signal.SIGTERM, head=worker_died, on_send=on_send)
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert [(r.event, r.reason) for r in recs if isinstance(r, Lifecycle)] == [("stop", "SIGTERM")]
    assert [r.type for r in recs if r.kind == "framework"] == []


def test_a_rank_blocked_in_c_when_sigterm_comes_still_says_stop_at_once(tmp_path):
    """torchrun stops a job with SIGTERM, then SIGKILL: a rank blocked in a collective whose peers are dying (a C
    call that retries on EINTR) never gets back to the interpreter to run a Python handler, and its `stop` never
    went out (the CI run of test_real_job that waited 60 s for rank 2's). Here the main thread waits, in C and
    without the GIL, for a mutex it holds itself, which no signal ends: the `stop` still goes out, from the
    signal wakeup fd's thread, while the process stays blocked; exactly one."""
    blocked = ("import ctypes, threading\n"
               "libc = ctypes.CDLL(None)\n"
               "mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER on glibc\n"
               "word = ctypes.c_int.from_buffer(mutex)  # glibc's lock word: 2 once a thread waits for the mutex\n"
               "def say_blocked():\n"
               "    while word.value != 2:\n"
               "        time.sleep(0.01)\n"
               "    print('blocked', flush=True)\n"
               "threading.Thread(target=say_blocked, daemon=True).start()\n"
               "libc.pthread_mutex_lock(mutex)\n"
               "libc.pthread_mutex_lock(mutex)  # held already: waits for good\n")
    script = tmp_path / "train.py"
    script.write_text(STOPPED.format(body=blocked, head="", on_send=""))
    sent = tmp_path / "sent.jsonl"

    def stops() -> list:
        lines = sent.read_bytes().splitlines() if sent.exists() else []
        return [(r.event, r.reason) for line in lines for r in decode(line) if isinstance(r, Lifecycle)]

    proc = subprocess.Popen([sys.executable, str(script), str(sent), str(tmp_path / "spool")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert select.select([proc.stdout], [], [], 60)[0], "the main thread never blocked"
        assert proc.stdout.readline() == "blocked\n"  # the main thread is inside pthread_mutex_lock
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while not stops():
            assert proc.poll() is None, proc.communicate()[1]  # still blocked: no Python handler has run
            assert time.monotonic() < deadline, "no stop within 30 s of SIGTERM while blocked in C"
            time.sleep(0.02)
        assert proc.poll() is None  # said while blocked, before any SIGKILL
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err
    assert stops() == [("stop", "SIGTERM")]


@pytest.mark.parametrize("first", ["wakeup thread", "handler"])
def test_each_signal_reaches_the_handler_and_the_wakeup_thread_and_one_stop_goes_out(tmp_path, no_wakeup_fd,
                                                                                        first):
    """Both see each stop signal, in either order (the wakeup fd's thread the moment it comes, the handler once
    the main thread gets there): one says the stop, and the handler still passes the signal on, once."""
    passed_on: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: passed_on.append(signum))  # a previous handler
    try:
        send = Recorder()
        client = TrainerClient(job="j1", send=send, background=False, spool_dir=tmp_path)
        paths = [lambda: client._on_wakeup(signal.SIGTERM), lambda: client._on_signal(signal.SIGTERM, None)]
        for say in paths if first == "wakeup thread" else paths[::-1]:
            say()
        client.close()
    finally:
        signal.signal(signal.SIGTERM, before)
    assert lifecycle(send) == [("stop", 0, "SIGTERM", "trainer")]
    assert passed_on == [signal.SIGTERM] and client.stopped_by == "SIGTERM"
    assert [r for r in send.records() if r.kind == "framework"] == []  # stopped: no `exit` at close


def test_a_wakeup_fd_the_program_holds_already_stays_its_own(tmp_path, no_wakeup_fd):
    """An asyncio loop on the main thread holds the process's one wakeup fd: the client leaves it alone (its stop
    then waits for the handler, as without the wakeup fd) and the program's fd is still set after the close."""
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno())
    try:
        client = TrainerClient(job="j1", send=Recorder(), background=False, spool_dir=tmp_path)
        assert client._signal_watch is None and wakeup_fd() == writer.fileno()
        assert signal.getsignal(signal.SIGTERM) == client._on_signal  # the handlers are still the client's
        client.close()
        assert wakeup_fd() == writer.fileno()
    finally:
        signal.set_wakeup_fd(-1)
        reader.close()
        writer.close()


def test_a_forked_child_gives_the_wakeup_fd_up_and_the_parent_keeps_it(tmp_path):
    """A DataLoader worker forked after the client inherits the wakeup fd setting, whose socket the parent's thread
    reads: the child gives it up as the fork returns (its own SIGTERM must not read as the rank's stop; the
    forked-child test above checks that), and the parent's is untouched."""
    body = ("pid = os.fork()\n"
            "if pid == 0:\n"
            "    fd = signal.set_wakeup_fd(-1)\n"
            "    os._exit(0 if fd == -1 else 3)\n"
            "_, status = os.waitpid(pid, 0)\n"
            "fd = signal.set_wakeup_fd(-1)\n"
            "signal.set_wakeup_fd(fd)\n"
            "print('child', os.waitstatus_to_exitcode(status), 'parent', fd == client._signal_watch._fd,\n"
            "      flush=True)\n"
            "client.close()\n")
    script = tmp_path / "train.py"
    script.write_text(STOPPED.format(body=body, head="", on_send=""))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "sent.jsonl"), str(tmp_path / "spool")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "child 0 parent True" in proc.stdout, proc.stderr
