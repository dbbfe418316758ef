"""The Batch API benchmark's two clients (real_batches.py), each run in a thread: the batch as a
Batch API client sends it (upload, create, poll, read the files) and the same requests sent by
the thread-pool script people write without one."""

from __future__ import annotations

import io
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import openai
from twisted.internet import defer

from bench.real.batch_workload import ITEM_TOKENS, input_file, item_body

POLL = 0.5  # seconds between two batches.retrieve
ENDED = ("completed", "failed", "expired", "cancelled")
ITEM_SECONDS = 3.0  # a batch not ended after 60 s + this per item is cancelled


@dataclass
class Sample:
    """A batch as one `batches.retrieve` saw it, at `at` (time.time())."""

    at: float
    status: str
    completed: int
    failed: int
    output_tokens: int


def sample_of(batch: Any) -> Sample:
    counts, usage = batch.request_counts, batch.usage
    return Sample(
        time.time(),
        batch.status,
        counts.completed if counts else 0,
        counts.failed if counts else 0,
        usage.output_tokens if usage else 0,
    )


@dataclass
class Job:
    """What the batch or the pool did, as its client saw it."""

    items: int
    interleave: bool = False
    max_tokens: int = ITEM_TOKENS
    batch_id: str = ""
    began: float = 0.0  # the batch created, the pool's first request sent
    wall_s: float = 0.0
    output_tokens: int = 0
    completed: int = 0
    failed: int = 0
    error: str = ""
    answers: list[tuple[float, int]] = field(default_factory=list)  # the pool's: (at, tokens)
    samples: list[Sample] = field(default_factory=list)  # the batch's polls

    def note(self, error: str) -> None:
        self.error = self.error or error


class Started:
    """Fires `ready` in the reactor, once, from any thread: the job's first item is done (or
    the job ended without one)."""

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor
        self.ready: defer.Deferred[None] = defer.Deferred()
        self._said = threading.Event()

    def __call__(self) -> None:
        if not self._said.is_set():
            self._said.set()
            self.reactor.callFromThread(self.ready.callback, None)


def client(base_url: str, timeout: float = 60.0) -> openai.OpenAI:
    """The official client at crossbar's route; no retries, so every failure is counted."""
    return openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=timeout)


def batch_job(oai: openai.OpenAI, job: Job, halt: threading.Event, started: Started) -> Job:
    """The batch of `job.items` as a client of the Batch API runs it (in a thread): upload,
    create, poll until it ended (cancelled past its time, or when `halt` is set), read its
    output and error files; `job` filled as it goes."""
    items = job.items
    try:
        uploaded = oai.files.create(
            file=("items.jsonl", io.BytesIO(input_file(items, job.interleave, job.max_tokens))),
            purpose="batch",
        )
        batch = oai.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        job.began, job.batch_id = time.time(), batch.id
        deadline, cancelled = job.began + 60.0 + ITEM_SECONDS * items, False
        while batch.status not in ENDED:
            if not cancelled and (halt.is_set() or time.time() > deadline):
                job.note("cancelled: " + ("the run stopped" if halt.is_set() else "too slow"))
                oai.batches.cancel(batch.id)
                cancelled, deadline = True, time.time() + 120.0
            elif cancelled and time.time() > deadline:
                raise TimeoutError(f"batch {batch.id} still {batch.status} 120 s after its cancel")
            time.sleep(POLL)
            batch = oai.batches.retrieve(batch.id)
            job.samples.append(sample_of(batch))
            if job.samples[-1].completed:
                started()
        job.wall_s = time.time() - job.began
        last = job.samples[-1] if job.samples else sample_of(batch)
        job.completed, job.output_tokens = last.completed, last.output_tokens
        job.failed = items - last.completed  # failed, expired, cancelled or never run
        if halt.is_set() and batch.status == "cancelled":
            job.failed = last.failed - _cancelled(oai, batch)  # stopped on purpose: not failed
            job.note("stopped once the agents were done")
        if batch.status != "completed":
            job.note(f"batch {batch.status}: {batch.errors}")
        if batch.output_file_id:
            lines = oai.files.content(batch.output_file_id).text.splitlines()
            tokens = sum(json.loads(x)["response"]["body"]["usage"]["completion_tokens"]
                         for x in lines)  # fmt: skip
            if len(lines) != last.completed or tokens != last.output_tokens:
                job.note(f"the output file has {len(lines)} lines and {tokens} tokens, the batch "
                         f"said {last.completed} and {last.output_tokens}")  # fmt: skip
        if batch.error_file_id:
            first = oai.files.content(batch.error_file_id).text.splitlines()[:1]
            job.note(f"first error line: {first[0][:200] if first else '(empty)'}")
    except Exception as e:
        job.note(f"{type(e).__name__}: {e}")
        job.failed = items - (job.samples[-1].completed if job.samples else 0)
    finally:
        started()
    return job


def _cancelled(oai: openai.OpenAI, batch: Any) -> int:
    """The batch's requests that never ran because it was cancelled."""
    if not batch.error_file_id:
        return 0
    lines = oai.files.content(batch.error_file_id).text.splitlines()
    return sum(
        1 for x in lines if (json.loads(x).get("error") or {}).get("code") == "batch_cancelled"
    )


def pool_job(
    oai: openai.OpenAI, job: Job, threads: int, halt: threading.Event, started: Started
) -> Job:
    """The batch's `job.items` requests sent by a thread pool, as a script does (in a thread)."""
    items, lock = job.items, threading.Lock()

    def one(i: int) -> None:
        if halt.is_set():  # stopped once the agents were done, or the run stopped
            return
        try:
            answer = oai.chat.completions.create(
                **item_body(i, items, job.interleave, job.max_tokens)
            )
            tokens = answer.usage.completion_tokens if answer.usage else 0
            with lock:
                job.answers.append((time.time(), tokens))
                job.completed += 1
                job.output_tokens += tokens
            started()
        except Exception as e:
            with lock:
                job.failed += 1
                job.note(f"{type(e).__name__}: {e}")

    job.began = time.time()
    try:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(items)))
    finally:
        job.wall_s = time.time() - job.began
        started()
    return job
