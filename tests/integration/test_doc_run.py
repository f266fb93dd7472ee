"""Every command README.md and docs/*.md show in a shell block runs as written, in a copy of the checkout. Each
document's commands run in order in one shell (tests/docrun.py says how they are cut and marked), in a fresh
folder holding the checkout's tracked files and its `.venv` (nothing is installed), with `gangwatch` on the PATH
from that `.venv`. Every command not marked must exit as the document shows (0 unless it shows an error); none
may write into the checkout outside the folders git ignores (`gangwatch-out/`, `gangwatch-demo/`), nor leave
anything in the temporary folder.

The docs' example addresses are the services CI starts: `kafka1:9092` and `127.0.0.1:9092` are $GANGWATCH_KAFKA
(also the default bootstrap, GANGWATCH_BOOTSTRAP), with a topic prefix and app id of this run's own;
`clickhouse://ch1:9000/gangwatch` and `clickhouse://127.0.0.1:9000/gangwatch` (a worker's store) are a database
of this run's own on $GANGWATCH_CLICKHOUSE, filled beforehand with the demo's incidents as a worker would have
stored them (the demo's job and one named as the docs' example job, llm-70b). At the end the run says how many
commands ran and how many are marked, by reason.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gangwatch.schemas.topics import TopicSettings
from gangwatch.streams.topic_admin import create_topics

from tests import docrun
from tests.conftest import DOC_RUN_PROPERTY

pytestmark = pytest.mark.integration

TIMEOUT = 240.0  # one document's commands, all together


@pytest.fixture(scope="module")
def services(kafka_bootstrap, clickhouse_addr, tmp_path_factory):
    """The docs' Kafka (gangwatch's topics, with this run's prefix) and the docs' worker store (this run's database,
    with the demo's job and a small job named as the docs' example job, llm-70b)."""
    import uuid

    unique = f"tdoc{uuid.uuid4().hex[:10]}"
    host, port = clickhouse_addr
    store = f"clickhouse://{host}:{port}/{unique}"
    scratch = tmp_path_factory.mktemp("doc-store")
    gw = [sys.executable, "-m", "gangwatch"]
    for argv in (["demo"], ["simulate", "--name", "llm-70b", "--tp", "2", "--pp", "1", "--dp", "4", "--gpus-per-node",
                            "2", "--duration", "150", "--fault", "xid79:60:n001", "--out", "sim"],
                 ["replay", "gangwatch-demo/demo.jsonl.gz", "--store", store, "--out", "out", "-q"],
                 ["replay", "sim/llm-70b.jsonl.gz", "--store", store, "--out", "out", "--append", "--telemetry", "-q"]):
        subprocess.run([*gw, *argv], cwd=scratch, check=True, capture_output=True)
    create_topics(TopicSettings(prefix=f"{unique}."), kafka_bootstrap)
    yield {"kafka": kafka_bootstrap, "store": store, "prefix": f"{unique}.", "app_id": unique}
    from clickhouse_driver import Client
    from kafka.admin import KafkaAdminClient

    Client(host=host, port=port).execute(f"DROP DATABASE IF EXISTS {unique}")
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        mine = [t for t in admin.list_topics() if t.startswith(unique)]
        if mine:
            admin.delete_topics(mine)
    finally:
        admin.close()


@pytest.mark.parametrize("doc", docrun.DOCS, ids=lambda p: p.name)
def test_the_docs_commands_run_as_written(doc: Path, tmp_path, request):
    cmds = docrun.commands(doc)
    marked = collections.Counter(next(r for r in docrun.MARK_REASONS if c.skip.startswith(r)) for c in cmds if c.skip)
    request.node.user_properties.append((DOC_RUN_PROPERTY, (doc.name, sum(not c.skip for c in cmds), dict(marked))))
    if all(c.skip for c in cmds):  # nothing ran, so nothing passed: say so (the summary counts the marks)
        pytest.skip(f"{doc.name}: no command to run: "
                    + (f"all {len(cmds)} marked ({', '.join(f'{n} {r}' for r, n in sorted(marked.items()))})"
                       if cmds else "it shows no shell command"))
    svc = request.getfixturevalue("services") if docrun.needs_services(cmds) else \
        {"kafka": "127.0.0.1:1", "store": "clickhouse://127.0.0.1:1/none", "prefix": "gw.", "app_id": "gangwatch"}
    clone = docrun.bare_clone(tmp_path / "gangwatch")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANGWATCH_")}
    env.update(PATH=f"{clone / '.venv' / 'bin'}{os.pathsep}{env['PATH']}", TMPDIR=str(tmp),
               PYTHONDONTWRITEBYTECODE="1", GANGWATCH_BOOTSTRAP=svc["kafka"], GANGWATCH_TOPIC_PREFIX=svc["prefix"],
               GANGWATCH_APP_ID=svc["app_id"], PIP_NO_INDEX="1")  # and should pip run after all: it cannot
    installed = docrun.environment_state()
    results = docrun.run(cmds, clone, env, svc["kafka"], svc["store"], TIMEOUT)
    failed = [r for r in results if r.failed]
    report = "\n".join(
        f"{r.command}\n    exit {'(not reached: a command before it did not end)' if r.rc is None else r.rc}"
        f"{f', failed inside: {r.errors}' if r.errors else ''}\n    "
        + "\n    ".join(r.output.strip().splitlines()[-8:])
        for r in failed)
    assert docrun.environment_state() == installed, f"{doc.name}'s commands changed the checkout's .venv"
    assert not failed, f"{len(failed)} of {len(results)} commands of {doc.name} failed:\n{report}"
    differ = [r for r in results if r.differs]
    assert not differ, f"{len(differ)} commands of {doc.name} printed other than the document shows:\n" + "\n".join(
        f"{r.command}\n  shown:\n    " + "\n    ".join(r.command.shown or ()) + "\n  printed:\n    "
        + "\n    ".join(r.output.strip().splitlines()) for r in differ)
    assert not docrun.written(clone), f"{doc.name}'s commands wrote into the checkout: {docrun.written(clone)}"
    left = sorted(p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_"))  # torch's own cache
    assert not left, f"{doc.name}'s commands left in the temporary folder: {left}"
