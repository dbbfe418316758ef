"""At most `upstream_max_connections` connections to one host are open or opening at once: a
request beyond waits, first come first served, for one to come free (a kept one once it has
rested, or room one leaves as it closes), at most `upstream_connect_queue_timeout`, then 503
in its caller's dialect (issue 47, item 8: a thousand slotless calls opened a thousand
connections to a one-slot host). On the in-memory network, and on the pool and a Clock."""

import json

from twisted.internet.defer import CancelledError, succeed
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from crossbar.config.values import parse_config
from crossbar.wire.pool import QUIET, ConnectionsBusy, HostPool, PoolCounts
from tests.support.memnet import MODEL, Host, start

URL = "http://titan:8080"
TOKENIZE = "/r/ctl/tokenize"
CONTROL = {"ctl": {"hosts": ["titan"], "default_model": MODEL, "queue": False}}


def open_connections(net) -> int:
    return sum(not h.lost for h in net.connections.get("titan", []))


def tokenize_all(crossbar, n: int) -> list:
    """`n` clients each sending one POST /tokenize, all at once (one flush for them all)."""
    clients = []
    body = json.dumps({"content": "hello"}).encode()
    head = b"POST " + TOKENIZE.encode() + b" HTTP/1.1\r\nHost: crossbar\r\n"
    head += b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    for _ in range(n):
        client = crossbar.net.client(crossbar.sites.proxy)
        client.transport.write(head + body)
        clients.append(client)
    crossbar.net.flush()
    return clients


def test_a_thousand_slotless_calls_open_at_most_the_bound_and_all_are_answered():
    crossbar = start(CONTROL, hosts=("titan",), parallel=1, upstream_max_connections=16)
    net, upstream = crossbar.net, crossbar.parts.upstream
    asked: list[Host] = []
    net.on_request["titan"] = asked.append  # the host answers when the story says
    clients = tokenize_all(crossbar, 1000)
    assert open_connections(net) == 16 and len(asked) == 16
    assert upstream.counts(URL) == PoolCounts(open=16, waiting=984)
    metrics = crossbar.parts.metrics.render().decode()
    assert 'crossbar_upstream_connections{host="titan"} 16.0' in metrics
    assert 'crossbar_upstream_waiting{host="titan"} 984.0' in metrics
    rounds = 0
    while asked:
        answering, asked[:] = list(asked), []
        for host in answering:
            host.answer(b'{"tokens": [1, 2]}')
        net.flush()
        net.run(2 * QUIET)  # rested: each kept connection goes to the next waiter
        assert open_connections(net) <= 16
        rounds += 1
    assert all(c.status == 200 for c in clients)
    assert len(net.connections["titan"]) == 16  # the same sixteen, kept, carried them all
    assert rounds == 63 and net.clock.seconds() < 10  # 1000 / 16, well within the wait
    assert upstream.counts(URL) == PoolCounts(open=16, waiting=0)


def messages(crossbar):
    body = json.dumps(
        {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    )
    return crossbar.post("/r/ctl/v1/messages", body.encode())


def test_a_request_that_waits_past_the_bound_gets_503_in_its_dialect_and_blames_no_host():
    crossbar = start(
        CONTROL,
        hosts=("titan",),
        upstream_max_connections=1,
        upstream_connect_queue_timeout="3s",
    )
    net = crossbar.net
    net.on_request["titan"] = lambda host: None  # thinks, for long
    first = messages(crossbar)
    second = messages(crossbar)
    assert open_connections(net) == 1 and first.status is second.status is None
    net.run(3)
    assert second.status == 503 and second.header(b"retry-after") == b"5"
    error = json.loads(second.received.split(b"\r\n\r\n", 1)[1])
    assert error["type"] == "error" and error["error"]["type"] == "overloaded_error"
    assert "none came free" in error["error"]["message"]
    assert crossbar.parts.hosts.healthy("titan")
    assert open_connections(net) == 1 and first.status is None  # the first still waits


def test_a_waiter_whose_client_leaves_leaves_no_trace():
    crossbar = start(CONTROL, hosts=("titan",), upstream_max_connections=1)
    net, upstream = crossbar.net, crossbar.parts.upstream
    net.on_request["titan"] = lambda host: None
    first, second = tokenize_all(crossbar, 2)
    assert upstream.counts(URL).waiting == 1
    second.transport.loseConnection()
    net.flush()
    assert upstream.counts(URL) == PoolCounts(open=1, waiting=0)
    assert not [c for c in net.clock.getDelayedCalls() if "give_up" in repr(c.func)]
    (host,) = net.connections["titan"]
    host.answer(b'{"tokens": [1]}')
    net.run(QUIET)
    assert first.status == 200 and len(net.connections["titan"]) == 1
    assert not host.lost and host.requests() == 1  # kept, and nobody took it for the leaver


def test_a_reload_changes_the_bound_and_a_larger_one_serves_the_waiters_at_once():
    crossbar = start(CONTROL, hosts=("titan",), upstream_max_connections=1)
    net, upstream = crossbar.net, crossbar.parts.upstream
    net.on_request["titan"] = lambda host: None
    tokenize_all(crossbar, 3)
    assert upstream.counts(URL) == PoolCounts(open=1, waiting=2)
    config = parse_config(
        {
            "server": {"db": ":memory:", "upstream_max_connections": 2},
            "hosts": {"titan": {"url": URL, "models": [MODEL], "parallel": 2}},
            "routes": CONTROL,
        }
    )
    upstream.reconfigure(config)
    net.flush()
    assert upstream.counts(URL) == PoolCounts(open=2, waiting=1)
    assert open_connections(net) == 2


# -- on the pool and a Clock


class Endpoints:
    """Every connect succeeds at once on a test transport; `opened` counts them."""

    def __init__(self) -> None:
        self.opened = 0

    def endpointForURI(self, uri):
        return self

    def connect(self, factory):
        self.opened += 1
        connection = factory.buildProtocol(None)
        connection.makeConnection(StringTransport())
        return succeed(connection)


def pool_with(bound: int, wait: float = 10.0) -> tuple[HostPool, Clock, Endpoints]:
    clock = Clock()
    endpoints = Endpoints()
    pool = HostPool(clock, endpoints, max_connections=bound, connect_wait=wait)
    return pool, clock, endpoints


def got(deferred) -> list:
    results: list = []
    deferred.addBoth(results.append)
    return results


def answer(connection) -> None:
    connection.request(b"POST / HTTP/1.1\r\n\r\n", None, False)
    connection.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")


def test_a_waiter_gets_a_released_connection_only_once_it_has_rested():
    pool, clock, endpoints = pool_with(1)
    origin, _ = pool.origin(b"http://host:8080/")
    (first,) = got(pool.connect(origin))
    waiting = got(pool.connect(origin))
    answer(first)  # released, resting
    assert waiting == [] and pool.take(origin) is None  # the waiter comes first, after the rest
    clock.advance(QUIET)
    assert waiting == [first] and endpoints.opened == 1


def test_the_retry_waits_for_room_and_an_idle_connection_closes_to_make_it():
    pool, clock, endpoints = pool_with(1)
    origin, _ = pool.origin(b"http://host:8080/")
    (kept,) = got(pool.connect(origin))
    answer(kept)
    clock.advance(QUIET)
    fresh = got(pool.connect(origin, fresh=True))  # a retry never takes a kept connection
    assert kept.lost and len(fresh) == 1 and fresh[0] is not kept
    assert endpoints.opened == 2 and pool.counts("http://host:8080").open == 1


def test_no_spare_is_opened_at_the_bound():
    pool, _, endpoints = pool_with(1)
    origin, _ = pool.origin(b"http://host:8080/")
    got(pool.connect(origin))
    pool.spare(origin)
    assert endpoints.opened == 1


def test_a_connection_that_closes_leaves_its_room_to_the_first_waiter():
    pool, clock, _ = pool_with(1)
    origin, _ = pool.origin(b"http://host:8080/")
    (busy,) = got(pool.connect(origin))
    first, second = got(pool.connect(origin)), got(pool.connect(origin))
    busy.connectionLost()  # the host closed it
    assert len(first) == 1 and first[0] is not busy and second == []
    clock.advance(10.0)
    assert second[0].check(ConnectionsBusy) and pool.counts("http://host:8080").waiting == 0


def test_a_cancelled_waiter_leaves_the_queue_and_its_timer():
    pool, clock, _ = pool_with(1)
    origin, _ = pool.origin(b"http://host:8080/")
    got(pool.connect(origin))
    waiting = pool.connect(origin)
    failed = got(waiting)
    waiting.cancel()
    assert failed[0].check(CancelledError)
    assert pool.counts("http://host:8080").waiting == 0 and clock.getDelayedCalls() == []


def test_a_request_past_the_bound_falls_back_to_another_route_as_from_a_busy_host():
    routes = {
        "ctl": {"hosts": ["titan"], "default_model": MODEL, "fallbacks": ["spill"]},
        "spill": {"hosts": ["atlas"], "default_model": MODEL},
    }
    crossbar = start(routes, upstream_max_connections=1, upstream_connect_queue_timeout="3s")
    net = crossbar.net
    net.on_request["titan"] = lambda host: None  # thinks, for long
    net.on_request["atlas"] = lambda host: host.answer(b'{"id": "m1", "content": []}')
    first = messages(crossbar)
    second = messages(crossbar)
    assert open_connections(net) == 1 and second.status is None
    net.run(3)
    assert second.status == 200 and second.header(b"x-crossbar-fallback") == b"spill"
    assert crossbar.store.usage[-1].fallback_reason == "host_busy"
    assert crossbar.parts.hosts.healthy("titan") and first.status is None
