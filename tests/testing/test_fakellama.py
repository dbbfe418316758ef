"""The fake answers like llama-server where crossbar looks: health, props, slots, models,
metrics, tokenizing, templates, control, slot actions and errors."""

import pytest_twisted
from twisted.internet import reactor

from crossbar.testing.fakellama import FakeLlama
from tests.support.fakehelp import client, events, get, post, user, wait


@pytest_twisted.async_yield_fixture
async def fake():
    fake = FakeLlama(reactor, models=["qwen-coder", "tiny"], parallel=2, ctx=64)
    await fake.start()
    yield fake
    await fake.stop()


@pytest_twisted.ensureDeferred
async def test_health_props_slots_and_models_describe_the_server(fake):
    response, health = await get(fake, "/health")
    assert (response.code, health) == (200, {"status": "ok"})
    _, props = await get(fake, "/props")
    assert props["total_slots"] == 2
    assert props["default_generation_settings"]["n_ctx"] == 64
    assert props["model_path"].endswith("qwen-coder.gguf")
    _, slots = await get(fake, "/slots")
    assert [(s["id"], s["n_ctx"], s["is_processing"], s["id_task"]) for s in slots] == [
        (0, 64, False, -1),
        (1, 64, False, -1),
    ]
    for path in ("/v1/models", "/models"):
        _, models = await get(fake, path)
        assert models["object"] == "list"
        assert [m["id"] for m in models["data"]] == ["qwen-coder", "tiny"]


@pytest_twisted.ensureDeferred
async def test_health_is_503_loading_model_until_the_load_delay_is_over():
    fake = FakeLlama(reactor, load_delay=3600)  # over by finish_loading, not by waiting
    await fake.start()
    try:
        loading = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
        response, body = await get(fake, "/health")
        assert (response.code, body) == (503, loading)
        response, body = await post(fake, "/v1/chat/completions", {"messages": user("hi")})
        assert (response.code, body) == (503, loading)
        loaded = fake.when_loaded()
        assert not loaded.called
        fake.finish_loading()
        await wait(loaded)
        response, _ = await get(fake, "/health")
        assert response.code == 200
    finally:
        await fake.stop()


@pytest_twisted.ensureDeferred
async def test_a_json_answer_echoes_the_model_and_carries_usage_and_timings(fake):
    response, body = await post(
        fake, "/v1/chat/completions", {"model": "tiny", "messages": user("hi"), "max_tokens": 4}
    )
    assert response.code == 200
    assert body["model"] == "tiny" and body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"]["content"] == fake.reply(user("hi"), max_tokens=4)
    assert body["choices"][0]["finish_reason"] == "length"
    n = len(fake.chat_prompt(user("hi")))
    assert body["usage"] == {
        "completion_tokens": 4,
        "prompt_tokens": n,
        "total_tokens": n + 4,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert {k: body["timings"][k] for k in ("cache_n", "prompt_n", "predicted_n")} == {
        "cache_n": 0,
        "prompt_n": n,
        "predicted_n": 4,
    }
    assert body["timings"]["prompt_ms"] >= 0 and body["timings"]["predicted_ms"] >= 0


@pytest_twisted.ensureDeferred
async def test_without_a_limit_the_reply_has_reply_tokens_and_stops(fake):
    _, body = await post(fake, "/v1/chat/completions", {"messages": user("hello")})
    assert body["usage"]["completion_tokens"] == fake.config.reply_tokens
    assert body["choices"][0]["finish_reason"] == "stop"


@pytest_twisted.ensureDeferred
async def test_openai_streams_carry_the_id_in_every_chunk_and_usage_last_then_done(fake):
    body = {"messages": user("s"), "stream": True, "stream_options": {"include_usage": True}}
    _, text = await post(fake, "/v1/chat/completions", body)
    chunks = events(text)
    assert chunks[-1] == "[DONE]"
    ids = {c["id"] for c in chunks[:-1]}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[1:-2])
    assert content == fake.reply(user("s"))
    assert chunks[-2]["choices"] == [] and chunks[-2]["usage"]["completion_tokens"] == 16
    assert chunks[-2]["timings"]["predicted_n"] == 16

    # Not asked for (llama-server's default): no usage chunk; the finish chunk has the timings.
    _, text = await post(fake, "/v1/chat/completions", {"messages": user("s"), "stream": True})
    chunks = events(text)
    assert not any("usage" in c for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-2]["timings"]["predicted_n"] == 16

    _, text = await post(
        fake, "/v1/completions", {"prompt": "p q", "max_tokens": 3, "stream": True}
    )
    chunks = events(text)
    assert chunks[-1] == "[DONE]" and len({c["id"] for c in chunks[:-1]}) == 1
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == fake.reply(
        prompt="p q", max_tokens=3
    )
    assert chunks[-2]["usage"]["completion_tokens"] == 3 and "timings" in chunks[-2]


@pytest_twisted.ensureDeferred
async def test_the_native_completion_endpoint_answers_llama_cpp_style(fake):
    _, body = await post(fake, "/completion", {"prompt": "one two", "n_predict": 2})
    assert body["content"] == fake.reply(prompt="one two", max_tokens=2)
    assert body["stop"] is True and body["stop_type"] == "limit"
    assert body["tokens_predicted"] == 2 and body["timings"]["prompt_n"] == 2
    _, text = await post(fake, "/completion", {"prompt": [5, 6, 7], "n_predict": 2, "stream": True})
    chunks = events(text)
    assert "[DONE]" not in chunks and chunks[-1]["stop"] is True
    assert "".join(c["content"] for c in chunks) == fake.reply(prompt=[5, 6, 7], max_tokens=2)


@pytest_twisted.ensureDeferred
async def test_a_raw_prompt_is_continued_as_given_and_nothing_is_echoed(fake):
    # Unlike a chat's trailing assistant message: the prompt is all there is to continue, so
    # an answer, streamed or not, is the new tokens alone.
    prompt = "Once upon" + fake.reply(prompt="Once upon", max_tokens=3)
    new = fake.reply(prompt=prompt, max_tokens=2)
    native = {"prompt": prompt, "n_predict": 2}
    _, body = await post(fake, "/completion", native)
    assert body["content"] == new
    _, text = await post(fake, "/completion", {**native, "stream": True})
    assert "".join(c["content"] for c in events(text)) == new
    openai = {"prompt": prompt, "max_tokens": 2}
    _, body = await post(fake, "/v1/completions", openai)
    assert body["choices"][0]["text"] == new
    _, text = await post(fake, "/v1/completions", {**openai, "stream": True})
    assert "".join(c["choices"][0]["text"] for c in events(text)[:-1]) == new


@pytest_twisted.ensureDeferred
async def test_tokenize_detokenize_template_and_input_tokens_agree_with_inference(fake):
    _, body = await post(fake, "/tokenize", {"content": "Hello, world"})
    assert len(body["tokens"]) == 3 and all(isinstance(t, int) for t in body["tokens"])
    _, text = await post(fake, "/detokenize", {"tokens": body["tokens"]})
    assert text == {"content": "Hello, world"}
    _, pieces = await post(fake, "/tokenize", {"content": "Hi!", "with_pieces": True})
    assert [p["piece"] for p in pieces["tokens"]] == ["Hi", "!"]
    messages = [{"role": "system", "content": "Be brief."}, *user("What is 2+2?")]
    _, template = await post(fake, "/apply-template", {"messages": messages})
    assert template["prompt"].endswith("<|im_start|>assistant\n")
    _, counted = await post(fake, "/v1/chat/completions/input_tokens", {"messages": messages})
    _, done = await post(fake, "/v1/chat/completions", {"messages": messages, "max_tokens": 1})
    assert counted == {"input_tokens": done["usage"]["prompt_tokens"]}


@pytest_twisted.ensureDeferred
async def test_a_prompt_over_the_context_is_400_exceed_context_size(fake):
    long = " ".join(["word"] * 80)
    response, body = await post(fake, "/v1/chat/completions", {"messages": user(long)})
    assert response.code == 400
    error = body["error"]
    assert error["type"] == "exceed_context_size_error" and error["code"] == 400
    assert error["n_ctx"] == 64 and error["n_prompt_tokens"] > 64
    assert "exceeds the available context size (64 tokens)" in error["message"]


@pytest_twisted.ensureDeferred
async def test_a_reply_that_would_overflow_the_context_stops_at_its_end(fake):
    prompt = " ".join(["word"] * 60)
    _, body = await post(fake, "/v1/completions", {"prompt": prompt, "max_tokens": 50})
    assert body["usage"]["completion_tokens"] == 4
    assert body["choices"][0]["finish_reason"] == "length"


@pytest_twisted.ensureDeferred
async def test_errors_use_llama_server_bodies(fake):
    response, body = await get(fake, "/nope")
    assert (response.code, body["error"]["type"], body["error"]["code"]) == (
        404,
        "not_found_error",
        404,
    )
    response, body = await post(fake, "/v1/chat/completions", [1, 2])
    assert response.code == 400 and body["error"]["type"] == "invalid_request_error"
    response, body = await post(fake, "/v1/chat/completions", {"messages": "hi"})
    assert response.code == 400 and "messages" in body["error"]["message"]
    response, body = await post(fake, "/v1/chat/completions", {"messages": user("x"), "id_slot": 7})
    assert response.code == 400 and "id_slot" in body["error"]["message"]
    assert fake.counters.completions == []


@pytest_twisted.ensureDeferred
async def test_slot_save_erase_restore_answer_like_llama_server(fake):
    await post(fake, "/v1/chat/completions", {"messages": user("keep me"), "id_slot": 1})
    kept = len(fake.cache.slots[1].tokens)
    _, saved = await post(fake, "/slots/1?action=save", {"filename": "a.bin"})
    assert (saved["id_slot"], saved["filename"], saved["n_saved"]) == (1, "a.bin", kept)
    assert "save_ms" in saved["timings"]
    _, erased = await post(fake, "/slots/1?action=erase", {})
    assert erased == {"id_slot": 1, "n_erased": kept} and fake.cache.slots[1].tokens == []
    _, restored = await post(fake, "/slots/1?action=restore", {"filename": "a.bin"})
    assert (restored["n_restored"], len(fake.cache.slots[1].tokens)) == (kept, kept)
    response, body = await post(fake, "/slots/1?action=restore", {"filename": "missing.bin"})
    assert response.code == 400 and body["error"]["type"] == "invalid_request_error"


@pytest_twisted.ensureDeferred
async def test_metrics_are_prometheus_text_with_llamacpp_names(fake):
    await post(fake, "/v1/chat/completions", {"messages": user("count me"), "max_tokens": 2})
    response, text = await get(fake, "/metrics")
    assert response.headers.getRawHeaders("content-type")[0].startswith("text/plain")
    assert "# TYPE llamacpp:prompt_tokens_total counter" in text
    assert f"llamacpp:prompt_tokens_total {fake.counters.prefill_tokens}" in text
    assert "llamacpp:tokens_predicted_total 2" in text
    assert "llamacpp:requests_processing 0" in text


@pytest_twisted.ensureDeferred
async def test_fake_counters_and_faults_are_readable_and_settable_over_http(fake):
    await post(fake, "/v1/chat/completions", {"messages": user("x"), "max_tokens": 1})
    _, counters = await get(fake, "/_fake/counters")
    assert counters["requests"] == {"/v1/chat/completions": 1}
    assert counters["completions"] == 1 and counters["last_completion"]["outcome"] == "done"
    assert counters["cache"]["slots"][0]["n_tokens"] > 0
    _, faults = await post(fake, "/_fake/faults", {"error_500": True})
    assert faults["error_500"] is True and fake.faults.error_500
    response, body = await post(fake, "/_fake/faults", {"error_500": False, "bogus": 1})
    assert response.code == 400 and "bogus" in body["error"]["message"]
    assert fake.faults.error_500  # nothing changed
    _, faults = await get(fake, "/_fake/faults")
    assert faults["error_500"] is True


@pytest_twisted.ensureDeferred
async def test_with_an_api_key_every_path_but_health_wants_it_as_llama_server_does():
    fake = FakeLlama(reactor, api_key="sk-llama")
    await fake.start()
    try:
        assert (await get(fake, "/health"))[0].code == 200
        response, body = await get(fake, "/props")
        assert response.code == 401
        assert body == {
            "error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}
        }
        for header in ({"Authorization": "Bearer sk-llama"}, {"X-Api-Key": "sk-llama"}):
            response = await wait(client().get(fake.url + "/v1/models", headers=header))
            await response.content()
            assert response.code == 200, header
        wrong = await wait(client().get(fake.url + "/slots", headers={"X-Api-Key": "sk-nope"}))
        await wrong.content()
        assert wrong.code == 401
    finally:
        await fake.stop()
