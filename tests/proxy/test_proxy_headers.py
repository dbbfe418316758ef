"""What crosses the proxy: hop-by-hop headers stop, credentials are swapped, X-Forwarded-* added."""

import json

import pytest_twisted
from twisted.internet import reactor
from twisted.web.resource import Resource
from twisted.web.server import Site

from tests.support.harness import MODEL, start_crossbar, wait


class Recorder(Resource):
    """An upstream that records each request and answers with some hop-by-hop headers."""

    isLeaf = True

    def __init__(self):
        super().__init__()
        self.seen = []

    def render_POST(self, request):
        self.seen.append(
            {
                "headers": {
                    k.decode().lower(): [v.decode() for v in vs]
                    for k, vs in request.requestHeaders.getAllRawHeaders()
                },
                "body": json.loads(request.content.read()),
            }
        )
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"keep-alive", b"timeout=5")
        request.setHeader(b"connection", b"x-secret-hop")
        request.setHeader(b"x-secret-hop", b"1")
        request.setHeader(b"x-upstream", b"kept")
        return json.dumps({"id": "chatcmpl-1", "choices": []}).encode()

    def render_GET(self, request):
        self.seen.append({"uri": request.uri.decode()})
        request.setHeader(b"content-type", b"application/json")
        return b"{}"


@pytest_twisted.ensureDeferred
async def test_headers_across_the_proxy_follow_rfc_9110_and_swap_credentials():
    recorder = Recorder()
    upstream = reactor.listenTCP(0, Site(recorder), interface="127.0.0.1")
    url = f"http://127.0.0.1:{upstream.getHost().port}"
    hosts = {
        "titan": {
            "url": url,
            "api_key": "host-key",
            "models": {MODEL: {"upstream": "Qwen3-Coder-30B", "parallel": 2}},
        }
    }
    crossbar = await start_crossbar(
        {}, {"convo": {"hosts": ["titan"], "keys": ["client-key"]}}, hosts=hosts
    )
    try:
        response = await wait(
            crossbar.client().post(
                crossbar.url("convo", "/v1/chat/completions"),
                data=json.dumps(
                    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
                ).encode(),
                headers={
                    "Authorization": "Bearer client-key",
                    "Connection": "X-Client-Hop",
                    "X-Client-Hop": "1",
                    "Keep-Alive": "timeout=9",
                    "TE": "trailers",
                    "Proxy-Authorization": "Basic abc",
                    "X-Forwarded-For": "10.1.1.1",
                    "X-Custom": "passes",
                    "X-Api-Key": "anthropic-style-client-key",
                    "Proxy": "http://attacker.example:3128",  # httpoxy
                },
            )
        )
        await response.content()
        assert response.code == 200
        (seen,) = recorder.seen
        headers = seen["headers"]
        assert headers["authorization"] == ["Bearer host-key"]
        assert "x-api-key" not in headers  # a client credential, however it is sent
        for hop in ("x-client-hop", "keep-alive", "te", "proxy-authorization", "proxy"):
            assert hop not in headers
        assert headers["x-custom"] == ["passes"]
        assert headers["x-forwarded-for"] == ["10.1.1.1, 127.0.0.1"]
        assert headers["x-forwarded-proto"] == ["http"]
        assert headers["x-forwarded-host"][0].startswith("127.0.0.1:")
        assert seen["body"]["model"] == "Qwen3-Coder-30B"  # the host's own name for the model
        assert response.headers.getRawHeaders("x-upstream") == ["kept"]
        assert not response.headers.hasHeader("x-secret-hop")
        assert not response.headers.hasHeader("keep-alive")
        assert response.headers.getRawHeaders("X-Crossbar-Lease") == ["new"]

        props = await wait(
            crossbar.client().get(
                crossbar.url("convo", f"/props?model={MODEL}&x=1"),
                headers={"Authorization": "Bearer client-key"},
            )
        )
        await props.content()
        assert recorder.seen[-1]["uri"] == "/props?model=Qwen3-Coder-30B&x=1"
    finally:
        await crossbar.stop()
        await upstream.stopListening()
