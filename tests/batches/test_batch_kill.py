"""kill -9 mid-batch loses nothing: crossbar as operators run it (`twistd -n crossbar`), a batch
of slow items, the instance running it killed with SIGKILL. On SQLite the one instance comes
back and finishes the batch; on PostgreSQL a second instance sharing the store takes the dead
one's claims once they run out and finishes it alone. Either way every custom_id is in the
output or the error file exactly once (an item that was running is run again)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import openai
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater

from crossbar.demo.launch import free_ports
from tests.support.batches import call, request_lines
from tests.support.harness import MODEL, start_fakes
from tests.support.pg import need_postgres, pg_schema
from tests.support.twistd import exited, spawn_twistd, until_status

ITEMS = 60


def _config(port: int, admin: int, db: str, fakes: dict[str, Any]) -> str:
    hosts = "".join(
        f'[hosts.{name}]\nurl = "{fake.url}"\nmodels = ["{MODEL}"]\nparallel = 2\n'
        for name, fake in fakes.items()
    )
    return (
        f'[server]\nlisten = "tcp:{port}:interface=127.0.0.1"\n'
        f'admin_listen = "tcp:{admin}:interface=127.0.0.1"\ndb = "{db}"\n'
        'health_interval = "1s"\nshutdown_grace = "5s"\nbatch_claim_timeout = "3s"\n'
        + hosts
        + f"[routes.convo]\nhosts = [{', '.join(repr(n).replace(chr(39), chr(34)) for n in fakes)}]\n"
    )


class Instance:
    """One twistd crossbar and the openai client at its route."""

    def __init__(self, tmp: Path, name: str, db: str, fakes: dict[str, Any]) -> None:
        self.port, self.admin = free_ports(2)
        self.config = tmp / f"{name}.toml"
        self.config.write_text(_config(self.port, self.admin, db, fakes))
        self.log = tmp / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{self.port}/r/convo/v1", api_key="none", max_retries=0
        )

    async def start(self) -> None:
        self.process = spawn_twistd(self.config, self.log)
        await until_status(f"http://127.0.0.1:{self.port}/r/convo/health", 200,
                           watch=[self.process])  # fmt: skip

    async def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        await exited(self.process)

    async def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            await exited(self.process)


async def _submit(instance: Instance) -> str:
    oai = instance.client
    file = await call(lambda: oai.files.create(
        file=("in.jsonl", io.BytesIO(request_lines(ITEMS, max_tokens=4))), purpose="batch"))  # fmt: skip
    batch = await call(lambda: oai.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"))  # fmt: skip
    return str(batch.id)


async def _until(instance: Instance, batch_id: str, done: Any, seconds: float = 90.0) -> Any:
    for _ in range(int(seconds / 0.2)):
        batch = await call(lambda: instance.client.batches.retrieve(batch_id))
        if done(batch):
            return batch
        await deferLater(reactor, 0.2, lambda: None)
    raise AssertionError(f"batch never reached the state wanted: {batch}")


async def _each_once(instance: Instance, batch: Any) -> None:
    seen: list[str] = []
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id:
            text = (await call(lambda f=file_id: instance.client.files.content(f))).text
            seen += [json.loads(line)["custom_id"] for line in text.splitlines()]
    assert sorted(seen) == sorted(f"req-{i}" for i in range(ITEMS))
    assert batch.request_counts.completed + batch.request_counts.failed == ITEMS


@pytest_twisted.ensureDeferred
async def test_kill_9_on_sqlite_and_the_restarted_instance_finishes_the_batch(
    tmp_path: Path,
) -> None:
    fakes = await start_fakes("a", "b", tokens_per_second=20)
    one = Instance(tmp_path, "one", str(tmp_path / "c.db"), fakes)
    try:
        await one.start()
        batch_id = await _submit(one)
        await _until(one, batch_id, lambda b: b.request_counts.completed >= 10)
        await one.kill()
        await one.start()
        batch = await _until(one, batch_id, lambda b: b.status == "completed")
        await _each_once(one, batch)
    finally:
        await one.stop()
        for fake in fakes.values():
            await fake.stop()


@pytest_twisted.ensureDeferred
async def test_kill_9_of_one_of_two_instances_on_postgresql_and_the_other_finishes(
    tmp_path: Path,
) -> None:
    need_postgres()
    fakes = await start_fakes("a", "b", tokens_per_second=20)
    with pg_schema() as db:
        first = Instance(tmp_path, "first", db, fakes)
        second = Instance(tmp_path, "second", db, fakes)
        try:
            await first.start()
            await second.start()
            batch_id = await _submit(first)
            await _until(second, batch_id, lambda b: b.request_counts.completed >= 10)
            await first.kill()
            batch = await _until(second, batch_id, lambda b: b.status == "completed")
            await _each_once(second, batch)
        finally:
            await first.stop()
            await second.stop()
            for fake in fakes.values():
                await fake.stop()
