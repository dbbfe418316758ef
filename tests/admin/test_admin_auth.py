"""Who may use the admin API: a bearer token when one is set, else loopback clients only."""

import json

import pytest
import pytest_twisted
from attrs import evolve
from treq.testing import StubTreq
from twisted.internet import reactor
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.web.resource import Resource

from crossbar.admin.auth import is_loopback, is_loopback_name
from crossbar.app.wiring import build_parts, make_sites
from crossbar.config.values import parse_config
from tests.support.admin_harness import start_service, write_config
from tests.support.harness import MODEL, start_fakes

ROUTES = {"convo": {"hosts": ["titan"], "default_model": MODEL}}
TOKEN = "s3cret-admin-token"


class From(Resource):
    """Serves `inner` as if every request came from `address` (the TCP peer)."""

    isLeaf = True

    def __init__(self, inner, address) -> None:
        super().__init__()
        self.inner, self.address = inner, address

    def render(self, request):
        request.client = self.address
        return self.inner.render(request)


@pytest_twisted.async_yield_fixture
async def offline_app():
    """An app whose host is never probed: enough for answers that need no traffic."""
    config = parse_config(
        {
            "server": {"db": ":memory:"},
            "hosts": {"titan": {"url": "http://127.0.0.1:9", "models": [MODEL]}},
            "routes": ROUTES,
        }
    )
    parts = await build_parts(config, reactor)
    yield config, parts
    parts.hosts.stop()
    await parts.upstream.close()
    await parts.store.close()


async def _no_reload() -> list[str]:
    return []


def stub(app, address, token=""):
    """A StubTreq talking to the admin app as a client at `address`."""
    config, parts = app
    config = evolve(config, server=evolve(config.server, admin_token=token))
    sites = make_sites(config, parts, _no_reload)
    return StubTreq(From(sites.api.resource(), address))


REMOTE = IPv4Address("TCP", "10.1.2.3", 40000)


@pytest_twisted.ensureDeferred
async def test_without_a_token_a_remote_client_is_refused_everywhere(offline_app):
    treq = stub(offline_app, REMOTE)
    for method, path in [
        ("GET", "/api/hosts"),
        ("GET", "/api/leases"),
        ("POST", "/api/hosts/titan/drain"),
        ("GET", "/metrics"),
        ("GET", "/"),
        ("GET", "/api/no-such-thing"),  # 403, not 404: nothing is revealed
    ]:
        response = await treq.request(method, f"http://admin{path}")
        body = json.loads(await response.content())
        assert response.code == 403, (method, path)
        assert body["error"]["type"] == "permission_error"
        assert "only loopback clients" in body["error"]["message"]
    assert not offline_app[1].hosts.draining("titan")


@pytest_twisted.ensureDeferred
async def test_without_a_token_loopback_clients_by_ipv4_ipv6_or_unix_socket_are_served(
    offline_app,
):
    for address in (
        IPv4Address("TCP", "127.0.0.1", 40000),
        IPv4Address("TCP", "127.8.9.10", 40000),
        IPv6Address("TCP", "::1", 40000),
        UNIXAddress(b"/run/crossbar-admin.sock"),
    ):
        response = await stub(offline_app, address).get("http://127.0.0.1/api/hosts")
        assert response.code == 200, address
        assert [h["name"] for h in json.loads(await response.content())["hosts"]] == ["titan"]


@pytest_twisted.ensureDeferred
async def test_with_a_token_a_remote_client_is_served_with_the_right_bearer_only(offline_app):
    treq = stub(offline_app, REMOTE, token=TOKEN)
    for headers, words in [
        ({}, "needs an Authorization: Bearer"),
        ({"Authorization": "Bearer wrong"}, "wrong admin token"),
        ({"Authorization": f"Basic {TOKEN}"}, "needs an Authorization: Bearer"),
        ({"Authorization": f"Bearer {TOKEN}x"}, "wrong admin token"),
    ]:
        response = await treq.get("http://admin/api/hosts", headers=headers)
        body = json.loads(await response.content())
        assert response.code == 401, headers
        assert response.headers.getRawHeaders("WWW-Authenticate") == ["Bearer"]
        assert body["error"] == {
            "code": 401,
            "type": "authentication_error",
            "message": body["error"]["message"],
        }
        assert words in body["error"]["message"]
    ok = await treq.get("http://admin/api/hosts", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.code == 200
    metrics = await treq.get("http://admin/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert metrics.code == 200 and b"crossbar_host_healthy" in await metrics.content()
    assert (await treq.get("http://admin/metrics")).code == 401


@pytest_twisted.ensureDeferred
async def test_with_a_token_the_dashboard_page_loads_without_it_but_its_data_does_not(offline_app):
    # The page holds no data; it asks for the token and sends it with every API call.
    treq = stub(offline_app, REMOTE, token=TOKEN)
    page = await treq.get("http://admin/")
    assert page.code == 200 and b"<title>crossbar</title>" in await page.content()
    assert (await treq.get("http://admin/api/leases")).code == 401


@pytest_twisted.ensureDeferred
async def test_with_a_token_a_loopback_client_needs_it_too(offline_app):
    treq = stub(offline_app, IPv4Address("TCP", "127.0.0.1", 40000), token=TOKEN)
    assert (await treq.get("http://127.0.0.1/api/hosts")).code == 401


@pytest_twisted.ensureDeferred
async def test_without_a_token_a_browser_page_from_elsewhere_cannot_use_the_api(tmp_path, serve):
    # DNS rebinding (a name resolving to 127.0.0.1) and cross-site POSTs from a web page.
    fakes = await start_fakes("titan")
    crossbar = await serve(write_config(tmp_path / "c.toml", fakes, ROUTES), fakes)
    code, body, _ = await crossbar.call("GET", "/api/leases", Host="evil.example:8081")
    assert code == 403 and "loopback names only" in body["error"]["message"]
    code, body, _ = await crossbar.call(
        "POST", "/api/hosts/titan/drain", Origin="http://evil.example"
    )
    assert code == 403 and "cross-site request" in body["error"]["message"]
    assert not crossbar.parts.hosts.draining("titan")
    port = crossbar.service.admin_port.getHost().port
    code, body, _ = await crossbar.call(
        "POST", "/api/hosts/titan/drain", Origin=f"http://127.0.0.1:{port}"
    )
    assert (code, body) == (200, {"host": "titan", "draining": True})
    code, _, _ = await crossbar.call("GET", "/api/hosts", Host=f"localhost:{port}")
    assert code == 200


@pytest_twisted.ensureDeferred
async def test_a_real_service_with_a_token_answers_401_without_it(tmp_path):
    fakes = await start_fakes("titan")
    path = write_config(tmp_path / "c.toml", fakes, ROUTES, server={"admin_token": TOKEN})
    crossbar = await start_service(path, fakes, token=TOKEN)
    try:
        assert (await crossbar.call("GET", "/api/hosts", token="nope"))[0] == 401
        assert (await crossbar.call("GET", "/api/hosts"))[0] == 200
    finally:
        await crossbar.stop()


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.255.0.3", True), ("::1", True), ("::ffff:127.0.0.1", True),
     ("10.0.0.1", False), ("::ffff:10.0.0.1", False), ("192.168.1.5", False), ("fe80::1", False)],
)  # fmt: skip
def test_loopback_addresses(host, loopback):
    kind = IPv6Address if ":" in host else IPv4Address
    assert is_loopback(kind("TCP", host, 1)) is loopback


@pytest.mark.parametrize(
    ("name", "loopback"),
    [("localhost", True), ("admin.localhost", True), ("127.0.0.1", True), ("::1", True),
     ("localhost.evil.example", False), ("10.0.0.1", False), ("crossbar", False)],
)  # fmt: skip
def test_loopback_names(name, loopback):
    assert is_loopback_name(name) is loopback


@pytest_twisted.ensureDeferred
async def test_without_a_token_a_page_elsewhere_is_refused_whatever_header_gives_it_away(
    tmp_path, serve
):
    # A browser may leave Origin out of a form POST, but then says Sec-Fetch-Site, or sends
    # a Referer: any of them naming another origin refuses the change.
    fakes = await start_fakes("titan")
    crossbar = await serve(write_config(tmp_path / "c.toml", fakes, ROUTES), fakes)
    port = crossbar.service.admin_port.getHost().port
    for headers in (
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},  # another port of localhost: another origin
        {"Referer": "http://evil.example/page"},
        {"Referer": f"http://127.0.0.1:{port + 1}/"},
    ):
        code, body, _ = await crossbar.call("POST", "/api/hosts/titan/drain", **headers)
        assert code == 403 and "cross-site request" in body["error"]["message"], headers
    assert not crossbar.parts.hosts.draining("titan")
    code, _, _ = await crossbar.call("GET", "/api/hosts", **{"Sec-Fetch-Site": "cross-site"})
    assert code == 200  # reading is not refused: the page cannot read the answer anyway
    ours = {"Sec-Fetch-Site": "same-origin", "Referer": f"http://127.0.0.1:{port}/"}
    code, body, _ = await crossbar.call("POST", "/api/hosts/titan/drain", **ours)
    assert (code, body) == (200, {"host": "titan", "draining": True})  # the dashboard's own
