"""The one-line integrations, each on a tiny CPU model: the records a real training run produces.

Every test trains for a few steps with a client that records what it would
send (`send=`), then checks the step records: their numbers, section times,
loss and grad-norm, and that the replica digest follows the weights.
"""

from __future__ import annotations

import pytest
from gangwatch.producers.trainer import TrainerClient, replica_digest
from gangwatch.schemas import DecodeError, Step, decode

from tests.helpers import need_module

pytestmark = pytest.mark.unit
torch = need_module("torch", "the `torch` extra")


class Sent(list):
    """A `send` that keeps the messages; `.steps()` decodes the step records."""

    def __call__(self, topic: str, key: bytes, value: bytes) -> None:
        self.append((topic, key, value))

    def records(self) -> list:
        recs = [r for _, _, v in self for r in decode(v)]
        assert not [r for r in recs if isinstance(r, DecodeError)]
        return recs

    def steps(self) -> list[Step]:
        return [r for r in self.records() if r.kind == "step"]


def client_options(tmp_path, sent: Sent) -> dict:
    return {"job": "j1", "rank": 0, "world_size": 1, "send": sent, "background": False, "exit_hooks": False,
            "spool_dir": tmp_path / "spool"}


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def batches(n: int, size: int = 8) -> list[tuple]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(size, 16, generator=g), torch.randn(size, 1, generator=g)) for _ in range(n)]


def test_a_plain_loop(tmp_path):
    sent = Sent()
    client = TrainerClient(**client_options(tmp_path, sent))
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, digests = [], []
    for step, (x, y) in enumerate(batches(4)):
        with client.step_context(step) as s:
            with client.section("compute"):
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
            opt.step()
            opt.zero_grad()
            s.loss = loss
            s.replica_digest = replica_digest(model.parameters())
        losses.append(loss.item())
        digests.append(s.replica_digest)
    client.close()
    steps = sent.steps()
    assert [s.step for s in steps] == [0, 1, 2, 3]
    assert all(s.compute_s > 0 and s.step_s >= s.compute_s for s in steps)
    assert steps[0].data_wait_s is None and all(s.data_wait_s > 0 for s in steps[1:])
    assert [s.loss for s in steps] == pytest.approx(losses)
    assert [s.replica_digest for s in steps] == digests and len(set(digests)) == 4  # the weights moved


def test_a_torch_optimizer_post_hook(tmp_path):
    sent = Sent()
    client = TrainerClient(**client_options(tmp_path, sent))
    model = tiny_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    handle = client.watch_optimizer(opt, first_step=100, digest_every=2)
    norms = []
    for x, y in batches(5):
        torch.nn.functional.mse_loss(model(x), y).backward()
        norms.append(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item())
        opt.step()
        opt.zero_grad()
    handle.remove()
    opt.step()  # not watched any more
    client.close()
    steps = sent.steps()
    assert [s.step for s in steps] == [100, 101, 102, 103, 104]
    assert [s.grad_norm for s in steps] == pytest.approx(norms)
    assert all(s.step_s > 0 for s in steps)
    digests = [s.replica_digest for s in steps]
    assert digests[1] is None and digests[3] is None  # every second step only
    assert len({digests[0], digests[2], digests[4]}) == 3
    assert digests[4] == replica_digest(model.parameters())


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*")  # inside Lightning, about torch's pytree API
def test_a_lightning_callback(tmp_path):
    pl = need_module("lightning.pytorch", "the `lightning` extra")
    from gangwatch.producers.trainer.lightning import GangwatchCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_model()
            self.losses: list[float] = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    sent = Sent()
    callback = GangwatchCallback(digest_every=1, **client_options(tmp_path, sent))
    module = Module()
    trainer = pl.Trainer(max_steps=3, accumulate_grad_batches=2, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path, callbacks=[callback])
    trainer.fit(module, torch.utils.data.DataLoader(batches(6), batch_size=None))
    steps = sent.steps()
    assert callback.client is None  # closed with the fit
    assert [s.step for s in steps] == [1, 2, 3]  # optimizer steps (two batches each), as trainer.global_step
    assert all(s.compute_s > 0 and s.grad_norm > 0 for s in steps)
    assert all(s.data_wait_s > 0 for s in steps[1:])
    assert [s.loss for s in steps] == pytest.approx(module.losses[1::2])  # each step's last micro-batch
    assert len({s.replica_digest for s in steps}) == 3
    assert steps[-1].replica_digest == replica_digest(module.parameters())


def test_a_hugging_face_trainer_callback(tmp_path):
    transformers = need_module("transformers", "the `hf` extra")
    need_module("accelerate", "the `hf` extra")
    from gangwatch.producers.trainer.huggingface import GangwatchCallback

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_model()

        def forward(self, x, labels=None):
            out = self.net(x)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    data = [{"x": x[i], "labels": y[i]} for x, y in batches(2, size=16) for i in range(16)]
    sent = Sent()
    callback = GangwatchCallback(digest_every=1, **client_options(tmp_path, sent))
    model = Model()
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=8,
                                          logging_steps=2, save_strategy="no", report_to=[], use_cpu=True,
                                          disable_tqdm=True, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    steps = sent.steps()
    assert callback.client is None
    assert [s.step for s in steps] == [1, 2, 3, 4]
    assert all(s.compute_s > 0 for s in steps) and all(s.data_wait_s > 0 for s in steps[1:])
    logged = {h["step"]: h for h in trainer.state.log_history if "loss" in h}
    assert sorted(logged) == [2, 4]
    assert [s.loss for s in steps] == [None, logged[2]["loss"], None, logged[4]["loss"]]
    assert [s.grad_norm is not None for s in steps] == [False, True, False, True]
    assert len({s.replica_digest for s in steps}) == 4
    assert steps[-1].replica_digest == replica_digest(model.parameters())



def _rank_main(rank: int, init: str, out: str) -> None:
    """One rank of a 2-rank gloo job on two made-up nodes; each makes its client after init_process_group."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    with open(f"{out}.{rank}", "wb") as sink:
        client = TrainerClient(job="j1", rank=rank, world_size=2, local_rank=0, local_world_size=1,
                               node=["n7", "n3"][rank], send=lambda t, k, v: sink.write(v + b"\n"),
                               background=False, exit_hooks=False, spool_dir=f"{out}.spool{rank}")
        client.close()
    dist.destroy_process_group()


def test_rank0_learns_every_ranks_node_through_torch_distributed(tmp_path):
    import torch.multiprocessing as mp

    out = str(tmp_path / "sent")
    mp.spawn(_rank_main, args=(f"file://{tmp_path / 'rendezvous'}", out), nprocs=2, join=True)
    recs = [r for rank in range(2) for line in (tmp_path / f"sent.{rank}").read_bytes().splitlines()
            for r in decode(line)]
    [job] = [r for r in recs if r.kind == "job"]  # from rank 0 only
    assert [(r.rank, r.node, r.gpu, r.dp) for r in job.ranks] == [(0, "n7", 0, 0), (1, "n3", 0, 1)]


def _watch_pauses(client: TrainerClient, saved) -> list[tuple[str, str, bool]]:
    """(event, reason, whether `saved()` was already true) for every pause and resume the client says."""
    seen: list[tuple[str, str, bool]] = []
    say = client.lifecycle

    def lifecycle(event, reason=None):
        seen.append((event, reason, saved()))
        say(event, reason)

    client.lifecycle = lifecycle
    return seen


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*")
def test_a_lightning_checkpoint_save_is_a_known_pause(tmp_path):
    pl = need_module("lightning.pytorch", "the `lightning` extra")
    from gangwatch.producers.trainer.lightning import GangwatchCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_model()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    sent = Sent()
    client = TrainerClient(**client_options(tmp_path, sent))
    ckpts = tmp_path / "ckpt"
    seen = _watch_pauses(client, lambda: len(list(ckpts.glob("*.ckpt"))))
    saver = pl.callbacks.ModelCheckpoint(dirpath=ckpts, every_n_train_steps=2, save_top_k=-1)
    trainer = pl.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path,
                         callbacks=[GangwatchCallback(client), saver])
    trainer.fit(Module(), torch.utils.data.DataLoader(batches(4), batch_size=None))
    assert seen == [("pause", "checkpoint", 0), ("resume", "checkpoint", 1),  # each save inside its pause
                    ("pause", "checkpoint", 1), ("resume", "checkpoint", 2)]
    assert "save_checkpoint" not in vars(trainer)  # the trainer's own method again after the fit
    client.flush()
    assert [(r.event, r.rank, r.source) for r in sent.records() if r.kind == "lifecycle"] == \
        [("pause", 0, "trainer"), ("resume", 0, "trainer")] * 2
    client.close()


def test_a_hugging_face_checkpoint_save_is_a_known_pause(tmp_path):
    transformers = need_module("transformers", "the `hf` extra")
    need_module("accelerate", "the `hf` extra")
    from gangwatch.producers.trainer.huggingface import GangwatchCallback

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_model()

        def forward(self, x, labels=None):
            out = self.net(x)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    data = [{"x": x[i], "labels": y[i]} for x, y in batches(2, size=16) for i in range(16)]
    sent = Sent()
    client = TrainerClient(**client_options(tmp_path, sent))
    out = tmp_path / "out"
    seen = _watch_pauses(client, lambda: len(list(out.glob("checkpoint-*"))))
    args = transformers.TrainingArguments(output_dir=str(out), max_steps=4, per_device_train_batch_size=8,
                                          logging_steps=1, save_strategy="steps", save_steps=2, report_to=[],
                                          use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
                                          save_safetensors=False)
    transformers.Trainer(model=Model(), args=args, train_dataset=data, callbacks=[GangwatchCallback(client)]).train()
    assert seen == [("pause", "checkpoint", 0), ("resume", "checkpoint", 1),
                    ("pause", "checkpoint", 1), ("resume", "checkpoint", 2)]
    client.close()
