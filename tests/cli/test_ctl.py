"""`crossbar ctl` against a real crossbar's admin port: tables for people, JSON for scripts."""

import contextlib
import io
import json
import socket

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.threads import deferToThread

from crossbar.cli.ctl import table
from crossbar.cli.main import build_parser, main
from crossbar.testing.fakerouter import FakeRouter
from crossbar.testing.fakestate import FakeConfig
from tests.support.admin_harness import conversation, start_service, write_config
from tests.support.harness import MODEL, start_fakes, wait
from tests.support.routes import CONVO

ROUTES = CONVO


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


async def ctl(crossbar, *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `crossbar ctl --admin <url> ARGV`, run in a thread
    while the reactor serves the admin port."""
    args = ["ctl", "--admin", crossbar.admin_url, *argv]
    return await wait(deferToThread(_run, args), 30)


@pytest_twisted.async_yield_fixture
async def crossbar(tmp_path):
    fakes = await start_fakes("titan", "atlas")
    running = await start_service(write_config(tmp_path / "c.toml", fakes, ROUTES), fakes)
    yield running
    await running.stop()


@pytest_twisted.ensureDeferred
async def test_drain_keeps_existing_conversations_and_sends_new_ones_elsewhere(crossbar):
    homes = {}
    for name in ("a", "b"):
        homes[name], _ = await crossbar.chat("convo", conversation(name))
    (on_titan,) = [name for name, host in homes.items() if host == "titan"]

    code, out, err = await ctl(crossbar, "drain", "titan")
    assert (code, err) == (0, "")
    assert out == "host titan is draining: it keeps its leases and gets no new ones\n"

    host, _ = await crossbar.chat("convo", conversation(on_titan))
    assert host == "titan"  # an existing conversation stays where its cache is
    for name in ("c", "d", "e"):
        host, _ = await crossbar.chat("convo", conversation(name))
        assert host == "atlas", name
    code, out, _ = await ctl(crossbar, "hosts")
    lines = out.splitlines()
    assert lines[0].split() == [
        "HOST", "HEALTH", "DRAINING", "MODEL", "SLOTS", "QUEUED", "LEASES", "CTX", "WAITING",
        "REASON",
    ]  # fmt: skip
    assert lines[1].split()[:7] == ["titan", "healthy", "yes", MODEL, "0/2", "0", "1"]
    assert lines[2].split()[:7] == ["atlas", "healthy", "no", MODEL, "0/2", "0", "4"]

    code, out, _ = await ctl(crossbar, "undrain", "titan")
    assert (code, out) == (0, "host titan takes new leases again\n")
    host, _ = await crossbar.chat("convo", conversation("f"))
    assert host == "titan"  # the least loaded again


@pytest_twisted.ensureDeferred
async def test_pin_unpin_release_leases_and_events_read_as_sentences_and_tables(crossbar):
    await crossbar.chat("convo", conversation("a"))
    await crossbar.chat("convo", conversation("b"))
    assert await ctl(crossbar, "pin", "convo", "atlas") == (0, "route convo pinned to atlas\n", "")
    code, out, _ = await ctl(crossbar, "leases", "--route", "convo")
    header, *rows, footer = out.splitlines()
    assert header.split() == ["ROUTE", "FP", "MODEL", "HOST", "IDLE"]
    assert footer == f"{len(rows)} of {len(rows)} leases"
    assert [r.split()[3] for r in rows] == ["atlas"]
    assert await ctl(crossbar, "unpin", "convo") == (0, "route convo unpinned (was atlas)\n", "")
    assert await ctl(crossbar, "unpin", "convo") == (0, "route convo was not pinned\n", "")
    assert await ctl(crossbar, "release", "convo") == (
        0,
        "released 1 lease(s) of route convo\n",
        "",
    )
    code, out, _ = await ctl(crossbar, "events", "--route", "convo", "--limit", "3")
    header, *rows = out.splitlines()
    assert header.split() == ["AT", "REASON", "ROUTE", "FP", "MODEL", "FROM", "TO"]
    assert [r.split()[2] for r in rows] == ["release", "release", "pin"]  # AT is two words
    code, out, _ = await ctl(crossbar, "routes")
    assert code == 0
    assert out.splitlines()[1].split()[:6] == ["convo", "config", "titan,atlas", "-", "0", "2"]


@pytest_twisted.ensureDeferred
async def test_usage_by_host_and_json_for_scripts(crossbar):
    await crossbar.chat("convo", conversation("a"))
    code, out, _ = await ctl(crossbar, "usage", "--by", "host", "--since", "1h")
    header, row = out.splitlines()
    assert header.split()[:3] == ["HOST", "REQUESTS", "ERRORS"]
    assert "CACHE HIT  TTFB P50 MS  TTFB P95 MS" in header
    assert row.split()[:3] in (["titan", "1", "0"], ["atlas", "1", "0"])
    code, out, _ = await ctl(crossbar, "usage", "--json")
    answer = json.loads(out)
    assert answer["by"] == "route" and answer["usage"][0]["requests"] == 1
    code, out, _ = await ctl(crossbar, "--json", "hosts")
    assert code == 0
    assert [h["name"] for h in json.loads(out)["hosts"]] == ["titan", "atlas"]


@pytest_twisted.ensureDeferred
async def test_usage_series_shows_each_routes_requests_per_bucket(crossbar):
    await crossbar.chat("convo", conversation("a"))
    await crossbar.chat("convo", conversation("b"))
    code, out, _ = await ctl(crossbar, "usage-series", "--since", "1h", "--bucket", "1h")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["AT", "ROUTE", "REQUESTS", "PROMPT", "CACHED", "COMPLETION"]
    assert sum(int(r.split()[-4]) for r in rows if r.split()[-5] == "convo") == 2
    code, out, _ = await ctl(crossbar, "usage-series", "--bucket", "soon")
    assert code == 1


@pytest_twisted.ensureDeferred
async def test_errors_are_one_line_with_crossbars_message_and_exit_1(crossbar):
    assert await ctl(crossbar, "pin", "convo", "orion") == (
        1,
        "",
        "crossbar ctl: 409: host 'orion' is not one of route 'convo''s hosts (titan, atlas); "
        "pin to one of those by name\n",
    )
    assert await ctl(crossbar, "drain", "orion") == (
        1,
        "",
        "crossbar ctl: 404: no host named 'orion' in the config\n",
    )
    code, out, err = await ctl(crossbar, "usage", "--since", "last week")
    assert (code, out) == (1, "") and err.startswith("crossbar ctl: 400: since: give seconds")


@pytest_twisted.ensureDeferred
async def test_a_refused_reload_prints_every_error(crossbar):
    write_config(crossbar.path, crossbar.fakes, {"convo": {"hosts": ["tytan"]}})
    code, out, err = await ctl(crossbar, "reload")
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        "crossbar ctl: 400: config refused; the old config stays:",
        '  routes.convo.hosts: unknown host "tytan"',
    ]
    write_config(crossbar.path, crossbar.fakes, ROUTES)
    code, out, _ = await ctl(crossbar, "reload")
    assert (code, out) == (0, f"config reloaded from {crossbar.path}\n")


@pytest_twisted.ensureDeferred
async def test_token_from_the_environment_and_a_clear_error_without_it(
    tmp_path, monkeypatch, serve
):
    fakes = await start_fakes("titan")
    path = write_config(tmp_path / "c.toml", fakes, ROUTES | {"convo": {"hosts": ["titan"]}},
                        server={"admin_token": "t0ken"})  # fmt: skip
    crossbar = await serve(path, fakes, token="t0ken")
    code, _, err = await ctl(crossbar, "hosts")
    assert code == 1
    assert err == (
        "crossbar ctl: 401: the admin API needs an Authorization: Bearer <admin_token> header\n"
    )
    monkeypatch.setenv("CROSSBAR_ADMIN_TOKEN", "t0ken")
    assert (await ctl(crossbar, "hosts"))[0] == 0
    assert (await ctl(crossbar, "hosts", "--token", "wrong"))[2].endswith("wrong admin token\n")
    monkeypatch.setenv("CROSSBAR_ADMIN", crossbar.admin_url)
    code, out, _ = await wait(deferToThread(_run, ["ctl", "hosts"]))
    assert code == 0 and out.startswith("HOST")


def test_an_unreachable_crossbar_is_one_line_and_exit_1():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket is closed
    code, out, err = _run(["ctl", "--admin", f"http://127.0.0.1:{port}", "leases"])
    assert (code, out) == (1, "")
    assert err.startswith(
        f"crossbar ctl: cannot reach crossbar's admin API at http://127.0.0.1:{port}: "
    )
    assert err.count("\n") == 1


def test_tables_align_columns_and_right_align_numbers():
    text = table(["NAME", "N", "NOTE"], [["titan", 5, None], ["atlas-long", 1234, "x"]])
    assert text.splitlines() == [
        "NAME            N  NOTE",
        "titan           5  -",
        "atlas-long  1,234  x",
    ]


@pytest_twisted.ensureDeferred
async def test_instances_lists_everyone_sharing_the_store_and_marks_who_answered(tmp_path, fleets):
    fleet = await fleets(
        tmp_path, str(tmp_path / "shared.db"), await start_fakes("titan", "atlas"), ROUTES
    )
    a, b = fleet.instances
    code, out, err = await ctl(a, "instances")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == [
        "INSTANCE", "STATE", "ADDRESS", "VERSION", "CONFIG", "STARTED", "HEARTBEAT",
        "IN_FLIGHT",
    ]  # fmt: skip
    rows = [line.split() for line in lines[1:3]]
    ids = {a.parts.instances.id, b.parts.instances.id}
    assert {row[0] for row in rows} == ids
    (me,) = [row for row in rows if row[1] == "*"]
    assert me[0] == a.parts.instances.id
    assert all("alive" in row for row in rows)
    assert "DIFFERS" not in out  # both read the same routes and hosts
    assert lines[-1] == "(* the instance that answered)"
    code, out, _ = await ctl(b, "--json", "instances")
    assert json.loads(out)["this"] == b.parts.instances.id


def test_events_leaves_the_limit_to_the_api_unless_one_is_given():
    # One default, the API's (100): ctl sends no limit of its own.
    sent = []

    class Client:
        def call(self, method, path, body=None, **query):
            sent.append({k: v for k, v in query.items() if v is not None})
            return {"events": []}

    parser = build_parser()
    for argv, limit in ((["ctl", "events"], None), (["ctl", "events", "--limit", "7"], 7)):
        args = parser.parse_args(argv)
        args.ctl(Client(), args)
        assert sent.pop().get("limit") == limit


@pytest_twisted.ensureDeferred
async def test_leases_and_routes_come_a_page_at_a_time_with_filters(crossbar):
    for name in "abcde":
        await crossbar.chat("convo", conversation(name))
    code, out, _ = await ctl(crossbar, "leases", "--limit", "2", "--route", "convo")
    *rows, footer = out.splitlines()[1:]
    assert code == 0 and len(rows) == 2
    assert footer.startswith("2 of 5; next page: --cursor ")
    cursor = footer.split("--cursor ")[1].split()[0]
    code, out, _ = await ctl(crossbar, "leases", "--limit", "2", "--cursor", cursor)
    assert out.splitlines()[-1].startswith("2 of 5; next page")
    code, out, _ = await ctl(crossbar, "leases", "--all", "--limit", "2")
    assert out.splitlines()[-1] == "5 of 5 leases" and len(out.splitlines()) == 1 + 5 + 1
    code, out, _ = await ctl(crossbar, "leases", "--host", "nowhere")
    assert out.splitlines()[-1] == "0 of 0 leases"
    code, out, _ = await ctl(crossbar, "routes", "--search", "onv", "--sort", "requests")
    assert [line.split()[0] for line in out.splitlines()[1:-1]] == ["convo"]
    assert out.splitlines()[-1] == "1 of 1 routes"


@pytest_twisted.ensureDeferred
async def test_load_and_unload_reach_a_routers_own_api_and_hosts_shows_the_state(tmp_path):
    router = FakeRouter(reactor, {"coder": FakeConfig(), "chat": FakeConfig()}, models_max=1)
    await router.start()
    hosts = {"gpu1": {"url": router.url, "models": "discover"}}
    path = write_config(tmp_path / "c.toml", {}, {"convo": {"hosts": ["gpu1"]}}, hosts=hosts)
    running = await start_service(path, {})
    try:
        code, out, err = await ctl(running, "load", "gpu1", "chat")
        assert (code, out, err) == (0, "host gpu1 model chat: loading\n", "")
        assert router.status["chat"] in ("loading", "loaded") and router.loads == 1
        await wait(running.parts.hosts.probe_all())
        code, out, _ = await ctl(running, "hosts")
        rows = {line.split()[3]: line.split()[4] for line in out.splitlines()[1:3]}
        assert rows == {"coder": "unloaded", "chat": "loaded"}
        assert "gpu1: router holding 1 model(s) at once; running chat" in out
        code, out, _ = await ctl(running, "unload", "gpu1", "chat")
        assert (code, out) == (0, "host gpu1 model chat: unloaded\n")
        assert router.status["chat"] == "unloaded"
        code, out, _ = await ctl(running, "model-events", "--host", "gpu1")
        events = [line.split()[-2:] for line in out.splitlines()[1:]]
        assert events == [["unload", "operator"], ["load", "operator"]]
        code, _, err = await ctl(running, "load", "gpu1", "nope")
        assert code == 1 and "does not list model 'nope'" in err
    finally:
        await running.stop()
        await router.stop()


def test_drain_grace_and_evacuate_now_send_their_options_and_say_what_happens():
    sent = []

    class Client:
        def __init__(self, answer):
            self.answer = answer

        def call(self, method, path, body=None, **query):
            sent.append((method, path, body))
            return self.answer

    parser = build_parser()
    args = parser.parse_args(["ctl", "drain", "titan"])
    _, said = args.ctl(Client({"host": "titan", "draining": True}), args)
    assert sent.pop() == ("POST", "/api/hosts/titan/drain", None)  # as before: no body
    assert said == "host titan is draining: it keeps its leases and gets no new ones"
    args = parser.parse_args(["ctl", "drain", "titan", "--grace", "30s"])
    answer = {"host": "titan", "draining": True, "grace": 30.0, "stopped": 0, "streaming": 2}
    _, said = args.ctl(Client(answer), args)
    assert sent.pop() == ("POST", "/api/hosts/titan/drain", {"grace": "30s"})
    assert said.endswith(
        "; its running answers (2 now) move to other hosts in 30s unless it is undrained before"
    )
    args = parser.parse_args(["ctl", "drain", "titan", "--grace", "0s"])
    _, said = args.ctl(Client({**answer, "grace": 0.0, "stopped": 2, "streaming": 0}), args)
    assert said.endswith("; 2 running answers moved to other hosts")

    evacuation = {"total": 2, "moved": 2, "warm": 1, "left": 0, "failed": 0, "running": False}
    args = parser.parse_args(["ctl", "evacuate", "titan", "--now", "--no-wait"])
    done = {**evacuation, "running": True, "moved": 0, "left": 2, "now": True, "stopped": 1}
    _, said = args.ctl(Client({"host": "titan", "evacuation": done}), args)
    assert sent.pop() == ("POST", "/api/hosts/titan/evacuate", {"now": True})
    assert said == "evacuating titan: 0/2 moved (1 warm), 2 left, 1 running answer moved"
    args = parser.parse_args(["ctl", "evacuate", "titan", "--no-wait"])
    args.ctl(Client({"host": "titan", "evacuation": evacuation}), args)
    assert sent.pop() == ("POST", "/api/hosts/titan/evacuate", None)


def test_a_grace_that_is_not_a_duration_is_refused_before_anything_is_sent(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["ctl", "drain", "titan", "--grace", "soon"])
    assert exit.value.code == 2  # argparse's usage error
    assert 'argument --grace: "soon" is not a duration' in capsys.readouterr().err
