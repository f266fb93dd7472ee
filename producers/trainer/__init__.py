"""The trainer client: what a training process imports to be watched by gangwatch.

    from gangwatch.producers.trainer import TrainerClient

    client = TrainerClient(tp=8, pp=4)                # after init_process_group; reads RANK, WORLD_SIZE, ...
    for step, batch in enumerate(loader):
        with client.step_context(step) as s:           # data_wait = the wait for this batch
            with client.section("compute"):
                loss = model(batch).sum()
                loss.backward()
            optimizer.step()
            s.loss = loss                              # a tensor is fine: read off the training thread

Set `GANGWATCH_BOOTSTRAP=host:9092` (or pass `bootstrap=`). Rank 0 sends the
job's topology (`job` record, topic `gw.jobs`); every rank sends its steps,
heartbeats every 5 s and framework events (`gw.telemetry`), keyed by job id,
as contract-v1 `batch` messages. Nothing here blocks or raises on the training
thread when Kafka is slow or away: records queue in memory, spool to local
disk, and are sent in order when the broker is back (client.py, delivery.py,
spool.py). Where `GANGWATCH_RELAY` names the node agent's relay (relay.py), the
client hands its records to it instead, and the
agent sends the node's ranks in one envelope per job; without it, or when it is
full or gone, the client sends them itself.

One-line integrations, each importing its framework only when imported itself:

| training code        | line                                                                  | module          |
|----------------------|-----------------------------------------------------------------------|-----------------|
| a plain loop         | `with client.step_context(step) as s:`                                | `loop`          |
| any torch optimizer  | `client.watch_optimizer(optimizer)`                                   | `optimizer`     |
| PyTorch Lightning    | `Trainer(callbacks=[GangwatchCallback()])` (`...trainer.lightning`)   | `lightning`     |
| Hugging Face Trainer | `Trainer(..., callbacks=[GangwatchCallback()])` (`...trainer.huggingface`) | `huggingface` |

`replica_digest(model.parameters())` fingerprints a model shard for the
silent-data-corruption vote (digest.py). Importing this package needs only
the core install (orjson, kafka-python); torch is imported when you pass
tensors, ask for CUDA timing (`cuda=True`), or use an integration.
"""

from gangwatch.producers.trainer.client import TrainerClient
from gangwatch.producers.trainer.digest import replica_digest

__all__ = ["TrainerClient", "replica_digest"]
