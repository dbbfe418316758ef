"""What crossbar knows of a router-mode host's loaded models: its listing, its own traffic, the
newest news winning; each load and unload it sees or causes, with the reason; how many models
the host holds at once."""

from __future__ import annotations

from crossbar.hosts.residency import OPERATOR, REQUEST, ROUTER, SWAP, ModelEvent, Residency


def events(found: list[ModelEvent]) -> list[tuple[str, str, str]]:
    return [(e.kind, e.model, e.reason) for e in found]


def test_the_first_listing_says_how_things_are_and_later_ones_what_changed():
    r = Residency("titan")
    assert r.take_listing({"coder": "loaded", "chat": "unloaded"}, asked=1.0) == []
    assert r.running() == ["coder"]
    found = r.take_listing({"coder": "unloaded", "chat": "loaded"}, asked=2.0)
    assert events(found) == [("unload", "coder", ROUTER), ("load", "chat", ROUTER)]
    assert r.running() == ["chat"]


def test_a_model_that_failed_to_load_is_a_fail_event():
    r = Residency("titan")
    r.take_listing({"coder": "loading"}, asked=1.0)
    assert events(r.take_listing({"coder": "failed"}, asked=2.0)) == [("fail", "coder", ROUTER)]
    assert r.running() == []


def test_crossbars_own_news_is_not_undone_by_a_listing_asked_before_it():
    r = Residency("titan")
    r.take_listing({"coder": "loaded", "chat": "unloaded"}, asked=1.0)
    assert events(r.loading("chat", now=5.0, reason=REQUEST)) == [("load", "chat", REQUEST)]
    r.take_listing({"coder": "loaded", "chat": "unloaded"}, asked=4.0)  # asked before the send
    assert r.state("chat") == "loading"
    r.take_listing({"coder": "unloaded", "chat": "loaded"}, asked=6.0)
    assert r.running() == ["chat"]


def test_a_request_for_a_running_model_loads_nothing_and_marks_it_used():
    r = Residency("titan")
    r.take_listing({"coder": "loaded", "chat": "loaded"}, asked=1.0)
    assert r.loading("coder", now=3.0, reason=REQUEST) == []
    assert r.used("chat", now=4.0) is False  # loaded: the request does not wait
    assert r.running() == ["coder", "chat"]  # least recently used first


def test_a_model_given_up_is_an_unload_with_its_reason():
    r = Residency("titan")
    r.take_listing({"coder": "loaded"}, asked=1.0)
    assert events(r.unloading("coder", now=2.0, reason=SWAP)) == [("unload", "coder", SWAP)]
    assert r.unloading("coder", now=3.0, reason=OPERATOR) == []  # not running: nothing to say


def test_the_capacity_is_the_config_else_the_routers_props_else_what_its_unloads_teach():
    assert Residency("titan", configured=2).capacity == 2
    r = Residency("titan")
    assert r.capacity is None
    r.props = 3
    assert (r.capacity, r.capacity_source) == (3, "props")
    r.props = 0  # the router says it has no limit
    assert r.capacity is None
    learner = Residency("titan")
    learner.take_listing({"coder": "loaded", "chat": "loaded", "vision": "unloaded"}, asked=1.0)
    learner.take_listing({"coder": "unloaded", "chat": "loaded", "vision": "loaded"}, asked=2.0)
    assert (learner.capacity, learner.capacity_source) == (2, "learned")


def test_an_answer_says_the_model_is_loaded():
    r = Residency("titan")
    r.loading("coder", now=1.0, reason=REQUEST)
    assert r.used("coder", now=1.5) is True  # still loading: a request sent now waits for it
    r.answered("coder", now=2.2)
    assert r.state("coder") == "loaded"
