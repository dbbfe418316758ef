"""Evacuating a real llama-server: the conversation's next turn on the other one is cached.

Two real llama-servers; a conversation on titan; titan evacuated. crossbar replays the
conversation's latest request on atlas with `n_predict: 0` (llama-server evaluates the prompt
into its cache and generates nothing), then moves the lease; the next turn, on atlas, reads at
least 80% of its prompt from atlas's cache.
"""

import pytest_twisted

from tests.real.dialogue import OpenAIChat
from tests.support.harness import MODEL

# A long opening, so the prompt is mostly history, as an agent's is.
CONTEXT = " ".join(
    f"Fact {i}: the {colour} box holds {i} {thing}."
    for i, (colour, thing) in enumerate(
        [("red", "apples"), ("blue", "pears"), ("green", "plums"), ("white", "figs")] * 6
    )
)


@pytest_twisted.ensureDeferred
async def test_an_evacuated_conversation_finds_its_prompt_cached_on_its_new_host(launch):
    crossbar, fleet = await launch(server={"handoff_store": "8MiB"})
    hosts, handoff = crossbar.parts.hosts, crossbar.parts.handoff
    await hosts.drain("atlas")
    convo = OpenAIChat(crossbar, f"Remember these facts. {CONTEXT}", False)
    for question in ("Which box holds apples?", "And pears?"):
        turn = await fleet.within(convo.say(question), 60, "a turn on titan")
        assert turn.host == "titan"
    await hosts.undrain("atlas")
    await fleet.within(handoff.store.flushed(), 10, "keeping the body")
    evacuation = await handoff.evacuator.start("titan")
    await fleet.within(evacuation.done, 60, "the evacuation")
    assert (evacuation.moved, evacuation.warm, evacuation.left) == (1, 1, 0)
    assert crossbar.parts.table.count("titan", MODEL) == 0
    turn = await fleet.within(convo.say("And plums?"), 60, "the turn after the move")
    assert turn.host == "atlas"
    assert turn.cached >= 0.8 * turn.prompt, turn
    assert "crossbar_handoff_cache_ratio_count 1.0" in crossbar.parts.metrics.render().decode()
