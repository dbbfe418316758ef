"""CORS per route: off by default (not even the host's `*` gets through); on a route with
cors_origins crossbar answers preflights itself and lets allowed origins read its answers."""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.threads import deferToThread
from twisted.web.resource import Resource
from twisted.web.server import Site

from crossbar.config.values import ConfigError, parse_config
from tests.support.browser import CHROMIUM, element, render
from tests.support.harness import MODEL, start_crossbar, start_fakes, wait

APP = "https://app.example"
ROUTES = {
    "web": {"hosts": ["titan"], "default_model": MODEL, "cors_origins": [APP + "/"]},
    "open": {"hosts": ["titan"], "default_model": MODEL, "cors_origins": ["*"]},
    "locked": {"hosts": ["titan"], "keys": ["k-1"], "cors_origins": [APP]},
    "plain": {"hosts": ["titan"], "default_model": MODEL},
}
CHAT = json.dumps({"messages": [{"role": "user", "content": "Hello from a browser."}]}).encode()
HOSTS = {"titan": {"url": "http://t:1", "models": [MODEL]}}


def errors_of(origins) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(
            {"hosts": HOSTS, "routes": {"web": {"hosts": ["titan"], "cors_origins": origins}}}
        )
    return info.value.errors


def test_cors_is_off_by_default_and_origins_are_kept_as_browsers_send_them():
    config = parse_config({"hosts": HOSTS, "routes": ROUTES})
    assert config.route("plain").cors_origins == ()
    assert config.route("web").cors_origins == (APP,)  # the trailing slash dropped


@pytest.mark.parametrize(
    ("origins", "message"),
    [
        (["app.example"], 'routes.web.cors_origins[0]: "app.example" is not an origin'),
        (
            [APP, "https://app.example/chat"],
            'routes.web.cors_origins[1]: "https://app.example/chat" is not an origin: no path',
        ),
        (
            ["https://app.example:99999"],
            'routes.web.cors_origins[0]: "https://app.example:99999" has a bad port',
        ),
        (["*", APP], 'routes.web.cors_origins: "*" allows every origin: list it alone'),
        ("*", "routes.web.cors_origins: must be an array of strings, not a string"),
    ],
)
def test_a_bad_origin_is_reported_under_its_dotted_path(origins, message):
    assert any(line.startswith(message) for line in errors_of(origins)), errors_of(origins)


@pytest_twisted.async_yield_fixture
async def crossbar():
    running = await start_crossbar(await start_fakes("titan"), ROUTES, server={"max_body": "64KiB"})
    yield running
    await running.stop()


async def call(crossbar, method: str, route: str, path: str, data=None, **headers: str):
    response = await wait(
        crossbar.client().request(method, crossbar.url(route, path), data=data, headers=headers)
    )
    return response, await wait(response.content())


def header(response, name: str) -> str | None:
    values = response.headers.getRawHeaders(name)
    return ", ".join(values) if values else None


@pytest_twisted.ensureDeferred
async def test_crossbar_answers_the_preflight_itself_and_never_forwards_or_leases_it(crossbar):
    response, body = await call(
        crossbar,
        "OPTIONS",
        "web",
        "/v1/chat/completions",
        Origin=APP,
        **{
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
        },
    )
    assert (response.code, body) == (204, b"")
    assert header(response, "Access-Control-Allow-Origin") == APP
    assert header(response, "Access-Control-Allow-Methods") == "GET, POST, OPTIONS"
    assert header(response, "Access-Control-Allow-Headers") == (
        "authorization, content-type, x-stainless-os"
    )
    assert header(response, "Access-Control-Max-Age") == "7200"
    assert header(response, "Vary") == "Origin"
    fake = crossbar.fakes["titan"]
    assert sum(fake.counters.requests.values()) == 0
    assert len(crossbar.parts.table) == 0
    assert crossbar.parts.limiter.in_flight("titan", MODEL) == 0


@pytest_twisted.ensureDeferred
async def test_a_preflight_from_an_origin_not_listed_is_refused_with_a_reason(crossbar):
    response, body = await call(
        crossbar, "OPTIONS", "web", "/v1/chat/completions", Origin="https://evil.example"
    )
    assert response.code == 403 and header(response, "Access-Control-Allow-Origin") is None
    assert "cors_origins" in json.loads(body)["error"]["message"]
    assert sum(crossbar.fakes["titan"].counters.requests.values()) == 0


@pytest_twisted.ensureDeferred
async def test_answers_to_an_allowed_origin_carry_the_origin_and_expose_crossbars_headers(
    crossbar,
):
    response, _ = await call(crossbar, "POST", "web", "/v1/chat/completions", CHAT, Origin=APP)
    assert response.code == 200
    assert header(response, "Access-Control-Allow-Origin") == APP
    exposed = header(response, "Access-Control-Expose-Headers")
    assert {"X-Crossbar-Host", "X-Crossbar-Lease", "X-Crossbar-Queue-Ms"} <= set(
        exposed.split(", ")
    )
    response, _ = await call(
        crossbar, "POST", "web", "/v1/chat/completions", CHAT, Origin="https://evil.example"
    )
    assert response.code == 200 and header(response, "Access-Control-Allow-Origin") is None
    response, _ = await call(
        crossbar, "POST", "open", "/v1/chat/completions", CHAT, Origin="http://localhost:3000"
    )
    assert header(response, "Access-Control-Allow-Origin") == "*"


@pytest_twisted.ensureDeferred
async def test_errors_crossbar_makes_are_readable_by_an_allowed_origin(crossbar):
    for route, path, data, status in [
        ("locked", "/v1/chat/completions", CHAT, 401),
        ("web", "/v1/nothing", CHAT, 404),
        ("web", "/v1/chat/completions", b"x" * 100_000, 413),
    ]:
        response, _ = await call(crossbar, "POST", route, path, data, Origin=APP)
        assert response.code == status
        assert header(response, "Access-Control-Allow-Origin") == APP, status


@pytest_twisted.ensureDeferred
async def test_without_cors_origins_options_goes_to_the_host_and_its_cors_headers_are_dropped(
    crossbar,
):
    response, _ = await call(crossbar, "OPTIONS", "plain", "/v1/chat/completions", Origin=APP)
    assert crossbar.fakes["titan"].counters.requests["/v1/chat/completions"] == 1  # forwarded
    assert response.code == 200
    assert [
        name for name, _ in response.headers.getAllRawHeaders() if b"Access-Control" in name
    ] == []
    response, _ = await call(crossbar, "POST", "plain", "/v1/chat/completions", CHAT, Origin=APP)
    assert response.code == 200 and header(response, "Access-Control-Allow-Origin") is None


PAGE = """<!doctype html><html><body><pre id="out">pending</pre><pre id="plain">pending</pre>
<script>
const ask = (route) => fetch("%(crossbar)s/r/" + route + "/v1/chat/completions", {
  method: "POST",
  headers: {"Content-Type": "application/json", "Authorization": "Bearer none"},
  body: JSON.stringify({messages: [{role: "user", content: "Hello from a page."}]}),
});
ask("web").then(async (r) => {
  const answer = await r.json();
  document.getElementById("out").textContent = "status=" + r.status
    + " lease=" + r.headers.get("X-Crossbar-Lease")
    + " host=" + r.headers.get("X-Crossbar-Host")
    + " model=" + answer.model;
}).catch((e) => { document.getElementById("out").textContent = "failed: " + e; });
ask("plain").then((r) => { document.getElementById("plain").textContent = "read " + r.status; })
  .catch((e) => { document.getElementById("plain").textContent = "blocked"; });
</script></body></html>"""


class Page(Resource):
    """The browser app's own origin: one page."""

    isLeaf = True
    html = b""

    def render_GET(self, request):
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        return self.html


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed")
@pytest_twisted.ensureDeferred
async def test_a_page_on_another_origin_calls_crossbar_and_reads_x_crossbar_lease(tmp_path):
    fakes = await start_fakes("titan")
    page = Page()
    pages = reactor.listenTCP(0, Site(page), interface="127.0.0.1")
    origin = f"http://127.0.0.1:{pages.getHost().port}"
    routes = {
        "web": {"hosts": ["titan"], "default_model": MODEL, "cors_origins": [origin]},
        "plain": {"hosts": ["titan"], "default_model": MODEL},
    }
    crossbar = await start_crossbar(fakes, routes)
    try:
        page.html = (PAGE % {"crossbar": crossbar.base}).encode()
        dom = await wait(deferToThread(render, origin + "/app.html", tmp_path / "profile"), 120)
        assert element(dom, "out") == f"status=200 lease=new host=titan model={MODEL}"
        assert element(dom, "plain") == "blocked"  # no cors_origins: the browser may not read
        # One answer only: the plain route's preflight went to the host, whose `*` crossbar
        # dropped, so the browser never sent that POST.
        fake = crossbar.fakes["titan"]
        assert [c.path for c in fake.counters.completions] == ["/v1/chat/completions"]
    finally:
        await pages.stopListening()
        await crossbar.stop()
