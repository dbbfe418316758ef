"""twistd running crossbar with time stamps taken along the slot hand-off path, for
bench/proxy/slot_handoff.py `--stamps`: where crossbar's share of a hand-off goes.

    .venv/bin/python bench/proxy/crossbar_stamps.py OUT.json -n --pidfile= crossbar -c CONFIG

Installs the epoll reactor, wraps (in this process only; crossbar's files are not touched) a
few of crossbar's and Twisted's functions so each notes `time.monotonic_ns()` under a label,
then runs twistd with the rest of the command line. At shutdown it writes the stamps to
OUT.json as `[[label, ns, cpu_ns], ...]`: the monotonic time and the CPU time of the thread
(the reactor's: `time.thread_time_ns()`), so that what crossbar did and how long it waited for
a CPU can be told apart. The labels, in the order a hand-off passes them:

- `woke`: the reactor's epoll_wait returned with at least one event;
- `host_data`: bytes from a host reached crossbar (wire/pool.py `HostConnection.dataReceived`);
- `ended`: an answer was all read, its connection back in the pool (`HostConnection.ended`);
- `finish`: the client's request was finished, its last bytes written (`Request.finish`, in
  wire/relay.py `Relay.run`), and `finished` when that returned;
- `admit`: the limiter looks for a waiter (limiter/slots.py `Limiter._admit`: from a release,
  or from an acquire);
- `attempt`: a request to a host is being made (wire/upstream.py `Upstream._attempt`);
- `request`: its head is built and a kept connection taken; its bytes are about to be written
  (`HostConnection.request` begins; the host may read them before it returns, so no stamp
  is taken after).

Each wrapper costs a microsecond or two; the figures are for finding where the time goes, not
for quoting as crossbar's.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from typing import Any

STAMPS: list[tuple[str, int, int]] = []


def stamped(label: str, function: Callable[..., Any], after: str = "") -> Callable[..., Any]:
    """`function`, noting the time under `label` as it is called (and under `after`, if
    given, as it returns)."""
    now, cpu, note = time.monotonic_ns, time.thread_time_ns, STAMPS.append

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        note((label, now(), cpu()))
        try:
            return function(*args, **kwargs)
        finally:
            if after:
                note((after, now(), cpu()))

    return wrapper


class _Poller:
    """An epoll object whose `poll` notes when it returned with events."""

    def __init__(self, poller: Any) -> None:
        self._poller = poller

    def poll(self, *args: Any) -> Any:
        events = self._poller.poll(*args)
        if events:
            STAMPS.append(("woke", time.monotonic_ns(), time.thread_time_ns()))
        return events

    def __getattr__(self, name: str) -> Any:
        return getattr(self._poller, name)


def install() -> None:
    """Install the epoll reactor and the wrappers."""
    from twisted.internet import epollreactor

    epollreactor.install()
    from twisted.internet import reactor

    from crossbar.hosts import registry
    from crossbar.limiter import slots
    from crossbar.proxy import channel, request, resource, usage
    from crossbar.wire import meter, pool, relay, upstream

    reactor._poller = _Poller(reactor._poller)  # type: ignore[attr-defined]
    connection = pool.HostConnection
    connection.dataReceived = stamped("host_data", connection.dataReceived)  # type: ignore[method-assign]
    connection.ended = stamped("ended", connection.ended)  # type: ignore[method-assign]
    connection.request = stamped("request", connection.request)  # type: ignore[method-assign]
    proxied = request.ProxyRequest
    proxied.finish = stamped("finish", proxied.finish, "finished")  # type: ignore[method-assign]
    slots.Limiter._admit = stamped("admit", slots.Limiter._admit)  # type: ignore[method-assign]
    attempt = upstream.Upstream._attempt
    upstream.Upstream._attempt = stamped("attempt", attempt)  # type: ignore[method-assign]
    # Finer, for a closer look at the answer's relay (no segment of the bench's table):
    connection.answered = stamped("answered", connection.answered)  # type: ignore[method-assign]
    relay.Relay.run = stamped("relay", relay.Relay.run)  # type: ignore[method-assign]
    body = relay._Body
    body.dataReceived = stamped("body", body.dataReceived)  # type: ignore[method-assign]
    body.connectionLost = stamped("body_end", body.connectionLost)  # type: ignore[method-assign]
    proxy = channel.ProxyChannel
    proxy.writeHeaders = stamped("client_head", proxy.writeHeaders)  # type: ignore[method-assign]
    meter.Meter.finish = stamped("meter", meter.Meter.finish)  # type: ignore[method-assign]
    recorder = usage.UsageRecorder
    recorder.remember_id = stamped("remember_id", recorder.remember_id)  # type: ignore[method-assign]
    recorder.finish = stamped("usage", recorder.finish)  # type: ignore[method-assign]
    slots.Limiter.acquire = stamped("acquire", slots.Limiter.acquire)  # type: ignore[method-assign]
    registry.Hosts.model = stamped("host_model", registry.Hosts.model)  # type: ignore[method-assign]
    resource.prepare = stamped("prepare", resource.prepare)
    upstream.Upstream.send = stamped("send", upstream.Upstream.send)  # type: ignore[method-assign]


def main() -> None:
    """The command line (see the module's docstring)."""
    out, sys.argv = sys.argv[1], ["twistd", *sys.argv[2:]]
    install()
    from twisted.internet import reactor
    from twisted.scripts.twistd import run

    def dump() -> None:
        with open(out, "w") as f:
            json.dump(STAMPS, f)

    reactor.addSystemEventTrigger("after", "shutdown", dump)  # type: ignore[attr-defined]
    run()


if __name__ == "__main__":
    main()
