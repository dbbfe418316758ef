"""Tracing in the whole service (started from a config file, as twistd does): a request's spans
reach the collector, a reload that changes `[tracing]` says it needs a restart, and a stop
exports what waits and ends the exporting thread."""

from __future__ import annotations

import pytest_twisted

from tests.support.admin_harness import conversation, start_service, toml, write_config
from tests.support.harness import MODEL, start_fakes
from tests.support.otlp import start_receiver

ROUTES = {"convo": {"hosts": ["titan"], "default_model": MODEL}}


def with_tracing(path, tracing):
    path.write_text(path.read_text() + toml({"tracing": tracing}))
    return path


@pytest_twisted.ensureDeferred
async def test_the_service_traces_a_request_reloads_without_retracing_and_stops_its_thread(
    tmp_path,
):
    receiver = await start_receiver()
    fakes = await start_fakes("titan")
    path = with_tracing(
        write_config(tmp_path / "c.toml", fakes, ROUTES), {"endpoint": receiver.endpoint}
    )
    crossbar = await start_service(path, fakes)
    try:
        tracing = crossbar.parts.tracing
        await crossbar.chat("convo", conversation("traced"))
        await receiver.until(
            lambda s: any(x.kind == "SERVER" for x in s), flush=tracing.queue.flush
        )

        with_tracing(
            write_config(path, fakes, ROUTES),
            {"endpoint": receiver.endpoint, "sample_ratio": 0.5},
        )
        code, body, _ = await crossbar.call("POST", "/api/reload")
        assert (code, body["notes"]) == (200, ["[tracing] changed; it takes effect at restart"])
        assert crossbar.parts.tracing is tracing  # still the tracer it started with

        before = len(receiver.spans)
        await crossbar.chat("convo", conversation("at the stop"))
    finally:
        await crossbar.stop()
        await receiver.stop()
    # The stop waited for the last spans to be exported, and ended the exporting thread.
    assert len(receiver.spans) > before
    thread = tracing.queue._thread
    thread.join(5)  # it said it was done as its last act: it ends at once
    assert not thread.is_alive()
