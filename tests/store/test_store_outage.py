"""While the store cannot be written, crossbar goes on routing from memory, says so, refuses
what it could not keep, and catches up by itself (in memory, on a Clock)."""

from tests.support.memnet import chat, start
from tests.support.routes import CONVO

ROUTES = CONVO
CHAT = "/r/convo/v1/chat/completions"


def answering():
    crossbar = start(ROUTES)
    for name in ("titan", "atlas"):
        crossbar.net.on_request[name] = lambda host: host.answer(
            b'{"id": "c", "usage": {"prompt_tokens": 5, "completion_tokens": 1}}'
        )
    return crossbar


def test_new_conversations_are_served_while_the_store_fails_and_written_when_it_recovers():
    crossbar = answering()
    store, net = crossbar.store, crossbar.net
    assert crossbar.post(CHAT, chat("before")).status == 200
    store.fail = True  # the disk is full
    hosts = [crossbar.post(CHAT, chat(f"during {n}")).header(b"X-Crossbar-Host") for n in range(4)]
    assert hosts.count(b"titan") == hosts.count(b"atlas") == 2  # placed as usual
    again = crossbar.post(CHAT, chat("during 0"))
    assert again.header(b"X-Crossbar-Lease") == b"reused"  # stuck to its host, from memory
    code, status = crossbar.admin("GET", "/api/status")
    assert code == 200 and status["status"] == "degraded"
    assert status["store"]["degraded"] and "injected" in status["store"]["reason"]
    assert status["store"]["unsaved_leases"] == 4 and status["store"]["unsaved_usage_rows"] == 5
    assert len(store.rows) == 1 and len(store.usage) == 1
    _, metrics = crossbar.admin("GET", "/metrics")
    assert "crossbar_store_degraded 1.0" in metrics

    store.fail = False  # space is freed; nobody restarts anything
    net.clock.advance(1)
    net.flush()
    code, status = crossbar.admin("GET", "/api/status")
    assert status["status"] == "ok" and status["store"]["unsaved_leases"] == 0
    assert {(k.fp, v.host) for k, v in store.rows.items()} == {
        (x.key.fp, x.host) for x in crossbar.parts.table.snapshot()
    }
    assert len(store.rows) == 5 and len(store.usage) == 6
    assert [e.reason for e in store.events].count("new") == 5
    _, metrics = crossbar.admin("GET", "/metrics")
    assert "crossbar_store_degraded 0.0" in metrics


def test_operator_changes_are_refused_while_the_store_fails_never_acknowledged_and_lost():
    crossbar = answering()
    store = crossbar.store
    crossbar.post(CHAT, chat("a conversation"))
    store.fail = True
    crossbar.post(CHAT, chat("another"))  # the store's failure is found out here
    leases, events = dict(store.rows), list(store.events)
    for method, path, body in [
        ("PUT", "/api/routes/convo/pin", {"host": "atlas"}),
        ("DELETE", "/api/routes/convo/leases", None),
        ("POST", "/api/hosts/titan/drain", None),
    ]:
        code, answer = crossbar.admin(method, path, body)
        assert code == 503, (path, answer)
        assert "store cannot be written" in answer["error"]["message"]
    assert crossbar.parts.table.pinned("convo") is None
    assert not crossbar.parts.hosts.draining("titan")
    assert len(crossbar.parts.table) == 2
    assert (store.rows, store.events) == (leases, events)
    store.fail = False
    crossbar.net.clock.advance(1)
    code, _ = crossbar.admin("PUT", "/api/routes/convo/pin", {"host": "atlas"})
    assert code == 200 and crossbar.parts.table.pinned("convo") == "atlas"


def test_a_failing_usage_write_alone_degrades_the_store_and_the_rows_wait():
    crossbar = answering()
    store, net = crossbar.store, crossbar.net
    assert crossbar.post(CHAT, chat("x")).status == 200  # its lease is written
    store.fail = True
    assert crossbar.post(CHAT, chat("x")).status == 200  # reused: only its usage row is written
    _, status = crossbar.admin("GET", "/api/status")
    assert status["store"]["degraded"] and status["store"]["unsaved_usage_rows"] == 1
    store.fail = False
    net.clock.advance(1)
    net.flush()
    assert len(store.usage) == 2
