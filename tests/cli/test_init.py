"""`crossbar init` against fake llama-servers on real ports, run as the command runs: what it
writes for one model, two models, a router and a server that wants a key; what it refuses
(an unreachable URL, a server that is no llama-server, an existing file), writing nothing; one
server under two spellings; and crossbar serving, checking and reloading what it wrote."""

import contextlib
import io
import socket
import tomllib

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.threads import deferToThread
from twisted.web.pages import notFound
from twisted.web.resource import Resource
from twisted.web.server import Site
from twisted.web.util import Redirect

from crossbar.cli.main import main
from crossbar.config import load_config
from crossbar.testing.fakellama import FakeConfig
from crossbar.testing.fakerouter import FakeRouter
from tests.support.admin_harness import conversation, start_service
from tests.support.fakehelp import Fakes
from tests.support.harness import MODEL, wait

KEY = "sk-llama-0d1e2f3a"


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


async def init(*argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `crossbar init ARGV`, in a thread while the reactor
    serves the fakes."""
    return await wait(deferToThread(_run, ["init", *argv]), 30)


@pytest_twisted.async_yield_fixture
async def fakes():
    """`await fakes(**knobs)`: a fake llama-server on port 0; all stopped after the test."""
    started = Fakes(models=[MODEL])
    yield started
    await started.stop()


@pytest_twisted.async_yield_fixture
async def web():
    """`web(resource)`: the URL of a plain HTTP server (no llama-server) serving it."""
    ports = []

    def serve(resource) -> str:
        site = Site(resource)
        site.noisy = False
        ports.append(reactor.listenTCP(0, site, interface="127.0.0.1"))
        return f"http://127.0.0.1:{ports[-1].getHost().port}"

    yield serve
    for port in ports:
        await port.stopListening()


class Answer(Resource):
    """The same answer to every path: a web server that is not a llama-server."""

    isLeaf = True

    def __init__(self, body: bytes, content_type: bytes) -> None:
        super().__init__()
        self.body, self.content_type = body, content_type

    def render_GET(self, request) -> bytes:
        request.setHeader(b"content-type", self.content_type)
        return self.body


def parsed(text: str) -> dict:
    return tomllib.loads(text)


@pytest_twisted.ensureDeferred
async def test_two_servers_of_one_model_become_two_hosts_and_one_route_on_stdout(fakes):
    a, b = await fakes(parallel=4, ctx=8192), await fakes()
    code, out, err = await init(a.url, b.url)
    assert (code, err) == (0, "")
    toml = parsed(out)
    hosts = {f"local-{a.port}": a.url, f"local-{b.port}": b.url}
    assert {name: h["url"] for name, h in toml["hosts"].items()} == hosts
    assert all(h["models"] == [MODEL] for h in toml["hosts"].values())
    assert toml["routes"] == {
        MODEL: {"hosts": list(hosts), "default_model": MODEL, "unknown_model": "default"}
    }
    assert toml["server"]["default_route"] == MODEL
    assert "# parallel = 4" in out and "# ctx = 8192" in out  # what /props said, for reading


@pytest_twisted.ensureDeferred
async def test_servers_of_two_models_get_a_route_per_model_listing_who_serves_it(fakes):
    both = await fakes(models=[MODEL, "gemma-small"])
    gemma = await fakes(models=["Gemma-Small"])
    code, out, _ = await init(f"both={both.url}", f"gemma={gemma.url}")
    assert code == 0
    toml = parsed(out)
    assert toml["hosts"]["both"]["models"] == [MODEL, "gemma-small"]
    assert {name: r["hosts"] for name, r in toml["routes"].items()} == {
        MODEL: ["both"],
        "gemma-small": ["both"],
        "gemma-small-2": ["gemma"],  # Gemma-Small: another model, named apart
    }
    assert toml["routes"]["gemma-small-2"]["default_model"] == "Gemma-Small"


@pytest_twisted.ensureDeferred
async def test_a_router_is_written_to_discover_its_models_with_a_route_for_each_it_lists():
    models = {"qwen": FakeConfig(parallel=4, ctx=8192), "gemma": FakeConfig()}
    router = FakeRouter(reactor, models, loaded=("qwen",))
    await router.start()
    try:
        code, out, _ = await init(router.url)
    finally:
        await router.stop()
    assert code == 0
    toml = parsed(out)
    (host,) = toml["hosts"].values()
    assert host["models"] == "discover"
    assert {name: r["default_model"] for name, r in toml["routes"].items()} == {
        "qwen": "qwen",
        "gemma": "gemma",
    }
    assert "qwen (loaded, 4 slots of 8192 tokens), gemma (unloaded)" in out.replace("\n# ", " ")
    assert router.status["gemma"] == "unloaded" and router.loads == 0  # asking loads nothing


@pytest_twisted.ensureDeferred
async def test_a_server_that_wants_a_key_is_refused_until_a_variable_holding_it_is_named(
    fakes, tmp_path, monkeypatch
):
    keyed = await fakes(api_key=KEY)
    path = tmp_path / "crossbar.toml"
    code, out, err = await init(keyed.url, "-o", str(path))
    assert (code, out) == (1, "") and not path.exists()
    assert err.splitlines() == [
        "crossbar init: nothing written; not every server can be put behind crossbar:",
        f"  {keyed.url}: wants an API key (401 on GET /props): pass --api-key-env NAME, NAME "
        "an environment variable holding the key (init writes the variable's name, never the "
        "key)",
    ]
    monkeypatch.delenv("LLAMA_API_KEY", raising=False)
    code, _, err = await init(keyed.url, "--api-key-env", "LLAMA_API_KEY", "-o", str(path))
    assert code == 1 and "$LLAMA_API_KEY is not set here" in err and not path.exists()
    monkeypatch.setenv("LLAMA_API_KEY", "sk-wrong")
    code, _, err = await init(keyed.url, "--api-key-env", "LLAMA_API_KEY", "-o", str(path))
    assert code == 1 and "refused the one in $LLAMA_API_KEY (401)" in err

    monkeypatch.setenv("LLAMA_API_KEY", KEY)
    code, _, err = await init(keyed.url, "--api-key-env", "LLAMA_API_KEY", "-o", str(path))
    assert code == 0, err
    text = path.read_text()
    assert KEY not in text
    (host,) = parsed(text)["hosts"].values()
    assert host["api_key_env"] == "LLAMA_API_KEY"
    assert load_config(path).hosts["local"].api_key == KEY  # one server here: "local"


@pytest_twisted.ensureDeferred
async def test_a_key_variable_is_written_only_for_the_servers_that_want_a_key(fakes, monkeypatch):
    open_, keyed = await fakes(), await fakes(api_key=KEY)
    monkeypatch.setenv("OTHER_KEY", "sk-other")
    monkeypatch.setenv("LLAMA_API_KEY", KEY)
    argv = ["--api-key-env", "OTHER_KEY", "--api-key-env", "LLAMA_API_KEY"]
    code, out, _ = await init(open_.url, keyed.url, *argv)
    assert code == 0
    hosts = parsed(out)["hosts"]
    assert "api_key_env" not in hosts[f"local-{open_.port}"]
    assert hosts[f"local-{keyed.port}"]["api_key_env"] == "LLAMA_API_KEY"  # the one it took


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens here once the socket is closed


@pytest_twisted.ensureDeferred
async def test_an_unreachable_or_silent_url_is_named_with_its_reason_and_nothing_written(
    fakes, tmp_path
):
    good = await fakes()
    closed = f"http://127.0.0.1:{_closed_port()}"
    with socket.socket() as silent:  # listens, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        quiet = f"http://127.0.0.1:{silent.getsockname()[1]}"
        path = tmp_path / "crossbar.toml"
        argv = (good.url, closed, quiet, "-o", str(path), "--timeout", "0.5")
        code, out, err = await init(*argv)
    assert (code, out) == (1, "") and not path.exists()
    assert err.splitlines()[1:] == [
        f"  {closed}: connection refused: no server listens there",
        f"  {quiet}: no whole answer within 0.5 s",
    ]


class Trickle(Protocol):
    """A server that answers every request a byte at a time, a byte every 50 ms: its head
    (`head_first`: the head at once, then the body so), then a 200 answer of a /props."""

    def __init__(self, head_first: bool) -> None:
        self.head_first = head_first
        self.timer = None

    def dataReceived(self, data: bytes) -> None:
        if self.timer is not None:
            return
        body = b'{"default_generation_settings": {"n_ctx": 4096}}' + b" " * 10_000
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
        if self.head_first:
            self.transport.write(head)
            self.left = body
        else:
            self.left = head + body
        self.drip()

    def drip(self) -> None:
        self.transport.write(self.left[:1])
        self.left = self.left[1:]
        self.timer = reactor.callLater(0.05, self.drip) if self.left else None

    def connectionLost(self, reason=None) -> None:
        if self.timer is not None and self.timer.active():
            self.timer.cancel()


@pytest_twisted.async_yield_fixture
async def trickling():
    """`trickling(head_first)`: the URL of a server that answers a byte every 50 ms."""
    ports = []

    def serve(head_first: bool) -> str:
        factory = Factory.forProtocol(lambda: Trickle(head_first))
        ports.append(reactor.listenTCP(0, factory, interface="127.0.0.1"))
        return f"http://127.0.0.1:{ports[-1].getHost().port}"

    yield serve
    for port in ports:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_server_that_trickles_its_answer_is_given_the_timeout_for_all_of_it(trickling):
    # Round 5: against a byte a second, init still ran after 9 minutes: the timeout bounded
    # each read, never the answer. Each answer here would take over eight minutes whole.
    slow_head, slow_body = trickling(head_first=False), trickling(head_first=True)
    code, out, err = await init(slow_head, slow_body, "--timeout", "0.5")
    assert (code, out) == (1, "")
    assert err.splitlines()[1:] == [
        f"  {slow_head}: no whole answer within 0.5 s",
        f"  {slow_body}: no whole answer within 0.5 s",
    ]


@pytest_twisted.ensureDeferred
async def test_a_server_that_is_no_llama_server_is_named_with_what_it_answered(web, fakes):
    missing = web(notFound())  # 404, an HTML page, to every path
    html = web(Answer(b"<!DOCTYPE html><html><body>My wiki</body></html>", b"text/html"))
    plain = web(Answer(b'{"status": "ok"}', b"application/json"))  # a web API
    login = web(Redirect(b"/login"))  # a redirect, never followed
    code, out, err = await init(missing, html, plain, login)
    assert (code, out) == (1, "")
    assert err.splitlines()[1:] == [
        f"  {missing}: not a llama-server: GET /props answered status 404 with an HTML page",
        f"  {html}: not a llama-server: GET /props answered an HTML page",
        f"  {plain}: not a llama-server: its /props has no default_generation_settings",
        f"  {login}: not a llama-server: GET /props answered status 302 with an HTML page",
    ]


@pytest_twisted.ensureDeferred
async def test_a_loading_server_is_told_to_wait_for_its_model(fakes):
    loading = await fakes(load_delay=3600)
    code, _, err = await init(loading.url)
    assert code == 1
    assert err.splitlines()[1] == (
        f"  {loading.url}: GET /props answered status 503: Loading model: still loading its "
        "model? run init again once its /health answers 200"
    )


@pytest_twisted.ensureDeferred
async def test_one_server_under_two_spellings_is_one_host(fakes):
    fake = await fakes()
    port = fake.port
    spellings = [fake.url, f"http://LOCALHOST:{port}/", f"127.0.0.1:{port}"]
    code, out, err = await init(*spellings)
    assert code == 0
    assert list(parsed(out)["hosts"]) == ["local"]
    assert err.splitlines() == [
        f"crossbar init: http://LOCALHOST:{port}/ is the same server as {fake.url}: one host",
        f"crossbar init: 127.0.0.1:{port} is the same server as {fake.url}: one host",
    ]


@pytest_twisted.ensureDeferred
async def test_an_existing_output_file_is_kept_unless_forced(fakes, tmp_path):
    fake = await fakes()
    path = tmp_path / "crossbar.toml"
    path.write_text("# mine\n")
    code, out, err = await init(fake.url, "-o", str(path))
    assert (code, out) == (2, "")
    assert err == f"crossbar init: {path} exists; nothing written (--force overwrites it)\n"
    assert path.read_text() == "# mine\n"
    code, _, err = await init(fake.url, "-o", str(path), "--force")
    assert code == 0
    assert err == (
        f"crossbar init: wrote {path}: hosts local; routes {MODEL}; next: crossbar check {path}\n"
    )
    assert parsed(path.read_text())["hosts"]["local"]["url"] == fake.url


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ftp://gpu1"], "'ftp://gpu1' is not a llama-server's base URL: not an http(s) URL"),
        (["GPU1=http://gpu1"], "GPU1=http://gpu1: 'GPU1' is not a host name"),
        (["a=http://gpu1", "a=http://gpu2"], "two servers named 'a'"),
        (["gpu1", "--port", "70000"], "--port 70000 is not a TCP port"),
        (["gpu1", "--api-key-env", "MY-KEY"], "--api-key-env 'MY-KEY' is not an environment"),
        (["gpu1", "--timeout", "0"], "--timeout 0 is not a positive number of seconds"),
    ],
)
def test_a_wrong_command_line_exits_2_before_asking_anyone(argv, message):
    code, out, err = _run(["init", *argv])
    assert (code, out) == (2, "")
    assert err.startswith(f"crossbar init: {message}") and err.count("\n") == 1


@pytest_twisted.ensureDeferred
async def test_check_prints_for_an_init_written_file_what_it_prints_written_by_hand(
    fakes, tmp_path
):
    a, b = await fakes(), await fakes()
    written = tmp_path / "init.toml"
    assert (await init(f"titan={a.url}", f"atlas={b.url}", "-o", str(written)))[0] == 0
    by_hand = tmp_path / "hand.toml"
    by_hand.write_text(
        f"""
[server]
listen = "tcp:8080"
admin_listen = "tcp:8081:interface=127.0.0.1"
db = "crossbar.db"
default_route = "{MODEL}"
handoff_store = "256MiB"

[hosts.titan]
url = "{a.url}"
models = ["{MODEL}"]

[hosts.atlas]
url = "{b.url}"
models = ["{MODEL}"]

[routes.{MODEL}]
hosts = ["titan", "atlas"]
default_model = "{MODEL}"
unknown_model = "default"
"""
    )
    checked = [_run(["check", str(path)]) for path in (written, by_hand)]
    assert [code for code, _, _ in checked] == [0, 0]
    (first, *summary), (_, *expected) = (out.splitlines() for _, out, _ in checked)
    assert first == f"config {written}: ok"
    assert summary == expected
    assert f"  titan  {a.url}" in summary
    assert any(line.startswith(f"  {MODEL}: hosts titan, atlas; ") for line in summary)


@pytest_twisted.ensureDeferred
async def test_crossbar_serves_what_init_wrote_and_reloads_it_written_again_with_a_new_host(
    fakes, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # the config's store is crossbar.db where crossbar runs
    a, b = await fakes(), await fakes()
    path = tmp_path / "crossbar.toml"
    ports = ("--port", "0")  # any free ports: a test's (init's default is 8080 and 8081)
    assert (await init(a.url, b.url, "-o", str(path), *ports))[0] == 0
    running = await start_service(path, {})
    try:
        host, reply = await running.chat(MODEL, conversation("a"))
        assert host in (f"local-{a.port}", f"local-{b.port}")
        assert reply["choices"][0]["message"]["content"]

        c = await fakes()
        code, _, _ = await init(a.url, b.url, c.url, "-o", str(path), "--force", *ports)
        assert code == 0
        status, body, _ = await running.call("POST", "/api/reload")
        assert (status, body["notes"]) == (200, [])
        hosts = await running.get("/api/hosts")
        assert [h["name"] for h in hosts["hosts"]] == [f"local-{p.port}" for p in (a, b, c)]
        await running.call("POST", f"/api/hosts/local-{a.port}/drain")
        await running.call("POST", f"/api/hosts/local-{b.port}/drain")
        host, _ = await running.chat(MODEL, conversation("b"))
        assert host == f"local-{c.port}"  # the host the reload added serves the route
    finally:
        await running.stop()
