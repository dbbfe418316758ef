"""The fake answers a scripted tool call in each API's streaming shape, read here by the official
clients (as the coding agents read them): the call comes whole, then the tool's result gets text."""

import pytest_twisted
from anthropic import Anthropic
from openai import OpenAI
from twisted.internet import reactor
from twisted.internet.threads import deferToThread

from crossbar.testing.fakellama import FakeLlama
from tests.support.fakehelp import wait

ARGS = {"path": "notes.txt"}
TASK = 'Read it.\nCALL read_file {"path": "notes.txt"}'
FUNCTION = {"name": "read_file", "parameters": {"type": "object", "properties": {}}}


@pytest_twisted.async_yield_fixture
async def fake():
    fake = FakeLlama(reactor, reply_tokens=6)
    await fake.start()
    yield fake
    await fake.stop()


def in_thread(fn):
    return wait(deferToThread(fn), 30)


@pytest_twisted.ensureDeferred
async def test_anthropic_streams_a_tool_use_block_and_then_text_for_its_result(fake):
    sdk = Anthropic(base_url=fake.url, api_key="none", max_retries=0)
    tools = [{"name": "read_file", "input_schema": {"type": "object"}}]
    ask = [{"role": "user", "content": [{"type": "text", "text": TASK}]}]

    def turn(messages):
        with sdk.messages.stream(
            model="m", max_tokens=32000, tools=tools, messages=messages
        ) as stream:
            return stream.get_final_message()

    first = await in_thread(lambda: turn(ask))
    (call,) = first.content
    assert (first.stop_reason, call.type, call.name, call.input) == (
        "tool_use",
        "tool_use",
        "read_file",
        ARGS,
    )
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "first word"}
    history = [*ask, {"role": "assistant", "content": [call.model_dump()]}]
    second = await in_thread(lambda: turn([*history, {"role": "user", "content": [result]}]))
    assert second.stop_reason == "max_tokens" and second.content[0].type == "text"
    assert second.usage.cache_read_input_tokens > 0  # the call's prompt is the next prefix


@pytest_twisted.ensureDeferred
async def test_openai_chat_streams_tool_call_deltas_with_finish_reason_tool_calls(fake):
    sdk = OpenAI(base_url=fake.url + "/v1", api_key="none", max_retries=0)
    tools = [{"type": "function", "function": FUNCTION}]

    def stream():
        chunks = sdk.chat.completions.create(
            model="m", stream=True, tools=tools, messages=[{"role": "user", "content": TASK}]
        )
        name, args, reasons = "", "", []
        for chunk in chunks:
            for choice in chunk.choices:
                reasons.append(choice.finish_reason)
                for delta in choice.delta.tool_calls or []:
                    name += delta.function.name or ""
                    args += delta.function.arguments or ""
        return name, args, reasons[-1]

    assert await in_thread(stream) == ("read_file", '{"path": "notes.txt"}', "tool_calls")


@pytest_twisted.ensureDeferred
async def test_responses_streams_a_function_call_item_and_completes_with_usage(fake):
    sdk = OpenAI(base_url=fake.url + "/v1", api_key="none", max_retries=0)
    tools = [{"type": "function", **FUNCTION}]

    def stream():
        with sdk.responses.stream(model="m", tools=tools, input=TASK) as events:
            return events.get_final_response()

    final = await in_thread(stream)
    (item,) = final.output
    assert (item.type, item.name, item.arguments) == (
        "function_call",
        "read_file",
        '{"path": "notes.txt"}',
    )
    assert item.call_id.startswith("call_") and final.usage.input_tokens > 0


@pytest_twisted.ensureDeferred
async def test_a_call_of_a_tool_the_request_does_not_offer_is_plain_text(fake):
    sdk = OpenAI(base_url=fake.url + "/v1", api_key="none", max_retries=0)
    answer = await in_thread(
        lambda: sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": TASK}])
    )
    assert answer.choices[0].message.tool_calls is None and answer.choices[0].message.content
