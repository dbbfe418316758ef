"""The proxy rules that hang on timing, told on an in-memory network and a Clock: a client
leaving while its host thinks, a keep-alive race on a pooled connection, a stop's grace."""

from memnet import MODEL, chat, start
from twisted.internet.defer import ensureDeferred

ROUTES = {"convo": {"hosts": ["titan", "atlas"], "default_model": MODEL}}
CHAT = "/r/convo/v1/chat/completions"


def test_a_client_leaving_while_its_host_thinks_aborts_the_host_and_blames_nobody():
    crossbar = start(ROUTES)
    net, limiter = crossbar.net, crossbar.parts.limiter
    client = crossbar.post(CHAT, chat())
    (upstream,) = net.connections["titan"]
    assert upstream.requests() == 1 and limiter.in_flight("titan", MODEL) == 1
    client.transport.loseConnection()  # the client hangs up before any answer
    net.flush()
    assert upstream.lost  # the host's connection is aborted: its slot frees
    assert limiter.in_flight("titan", MODEL) == 0
    assert crossbar.parts.hosts.healthy("titan")
    assert "atlas" not in net.connections  # not resent for nobody
    (row,) = crossbar.store.usage
    assert (row.status, row.error, row.host) == (499, "client disconnected", "titan")


def test_a_pooled_connection_the_host_dropped_is_retried_once_on_a_fresh_one():
    crossbar = start(ROUTES)
    net = crossbar.net
    net.on_request["titan"] = lambda host: host.answer()
    first = crossbar.post(CHAT, chat("one"))
    assert first.status == 200
    (pooled,) = net.connections["titan"]  # kept alive for the next request

    # The host closes the idle connection just as crossbar reuses it: the request is lost
    # without a byte of answer. That is a keep-alive race, not a host failure.
    def drop_then_answer(host):
        if host is pooled:
            host.transport.abortConnection()
        else:
            host.answer()

    net.on_request["titan"] = drop_then_answer
    second = crossbar.post(CHAT, chat("one"))
    assert second.status == 200
    assert second.header(b"X-Crossbar-Host") == b"titan"
    assert [c.requests() for c in net.connections["titan"]] == [2, 1]  # once more, fresh
    assert crossbar.parts.hosts.healthy("titan")
    assert "atlas" not in net.connections


def test_a_fresh_connection_refused_moves_the_request_and_marks_the_host_down():
    crossbar = start(ROUTES)
    net = crossbar.net
    net.refusing.add("titan")
    net.on_request["atlas"] = lambda host: host.answer()
    client = crossbar.post(CHAT, chat())
    assert client.status == 200 and client.header(b"X-Crossbar-Host") == b"atlas"
    assert not crossbar.parts.hosts.healthy("titan")
    reasons = [(e.reason, e.from_host, e.to_host) for e in crossbar.store.events]
    assert reasons == [("new", "", "titan"), ("unhealthy", "titan", "atlas")]


def test_a_client_leaving_during_the_hosts_name_lookup_is_not_a_connect_failure():
    # Twisted reports a connect cancelled during its name lookup as DNSLookupError; taken at
    # its word, that marked a healthy host down and resent the request for nobody.
    crossbar = start(ROUTES)
    net = crossbar.net
    net.stall.add("titan")
    net.stall.add("atlas")
    client = crossbar.post(CHAT, chat())
    assert net.names.asked == ["titan"]
    client.transport.loseConnection()
    net.flush()
    assert crossbar.parts.hosts.healthy("titan")
    assert net.names.asked == ["titan"]  # nothing was resent to atlas
    assert crossbar.parts.limiter.in_flight("titan", MODEL) == 0
    (row,) = crossbar.store.usage
    assert (row.status, row.error) == (499, "client disconnected")


def test_a_stop_waits_out_the_grace_then_closes_what_is_left_with_a_shutdown_row():
    crossbar = start(ROUTES)
    net, proxy = crossbar.net, crossbar.sites.resource
    held = crossbar.post(CHAT, chat("held"))  # titan never answers this one
    net.on_request["atlas"] = lambda host: None
    answered_later = crossbar.post(CHAT, chat("answered later"))
    (slow,) = net.connections["atlas"]
    assert proxy.running == 2
    drained = []
    ensureDeferred(proxy.drain(30)).addCallback(drained.append)
    net.clock.advance(10)
    slow.answer()  # one finishes within the grace
    net.flush()
    assert answered_later.status == 200 and proxy.running == 1
    net.clock.advance(19.9)
    net.flush()
    assert drained == [] and not held.lost  # still within the grace period
    net.clock.advance(0.1)
    net.flush()
    assert drained == [1]  # one was aborted
    assert held.lost and held.received == b""  # its connection is closed, nothing sent
    assert net.connections["titan"][0].lost  # and the host's request aborted
    rows = {row.fp: row for row in crossbar.store.usage}
    errors = sorted((row.status, row.error) for row in rows.values())
    assert errors == [(200, ""), (503, "shutdown")]
    assert crossbar.parts.limiter.in_flight("titan", MODEL) == 0


def test_a_stop_with_nothing_running_returns_at_once():
    crossbar = start(ROUTES)
    crossbar.net.on_request["titan"] = lambda host: host.answer()
    assert crossbar.post(CHAT, chat()).status == 200
    drained = []
    ensureDeferred(crossbar.sites.resource.drain(30)).addCallback(drained.append)
    assert drained == [0]
