"""The workloads of bench/real/real_valve.py (its docstring says what each is): who works when,
with what think times, on how many one-slot llama-servers, as every router meets them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from bench.real import real_cache
from bench.real.agent_workload import Phase, Workload, phases_of

WORKLOADS = ("overload", "shape", "default")
# One slot a host, so a second busy conversation there waits; 512 MiB of host-RAM prompt cache
# has room for every conversation of these workloads (the shape). But llama-server
# saves a slot's prompt there only when the next prompt keeps less than half of it
# (server-context.cpp, `f_keep < 0.5`): while conversations are short beside the shared system
# prompt, two that take turns on one slot each prefill their own part again at every switch.
ONE_SLOT_ARGS = ("-np", "1", "-c", "8192", "-t", "1", "--cache-ram", "512", "--no-repack")
# An agent's reply is a tool call or a patch: tens to hundreds of tokens (this model writes to
# its limit). Busy agents' turns then hold a slot for seconds, as on a GPU box with a big model.
AGENT_REPLY = 96


@dataclass(frozen=True)
class Plan:
    """One workload as every router meets it: the hosts, their flags, the phases."""

    name: str
    hosts: int
    llama_args: tuple[str, ...]
    conversations: int
    phases: tuple[Phase, ...]
    workload: Workload

    @property
    def expected(self) -> int:
        """Turns in the whole schedule."""
        return sum(p.turns for p in self.phases)


def start_order_spread(conversations: int, hosts: int) -> dict[int, int]:
    """Where a sticky router that balances leases puts conversations begun one at a time:
    conversation i on host i mod `hosts` (crossbar's chooser: fewest leases per slot, then
    config order)."""
    return {c: c % hosts for c in range(conversations)}


def busy_rounds(
    conversations: int, hosts: int, rounds: int, crowd: int, extra: int
) -> list[tuple[int, ...]]:
    """The busy conversations of each round: in round r, `crowd` that share host r mod `hosts`
    under the start-order spread, then `extra` from the next host (each host's conversations
    taken in turn from one of its rounds to the next)."""
    spread = start_order_spread(conversations, hosts)
    members = {h: [c for c in range(conversations) if spread[c] == h] for h in range(hosts)}

    def some(host: int, n: int, r: int) -> list[int]:
        there = members[host]
        first = (r // hosts) % len(there) if there else 0
        return (there[first:] + there[:first])[: min(n, len(there))]

    return [
        tuple(some(r % hosts, crowd, r) + some((r + 1) % hosts, extra, r)) for r in range(rounds)
    ]


def think_times(seed: int, conversation: int) -> Callable[[float], float]:
    """Conversation `conversation`'s think times, drawn in order from 0..top seconds (ms):
    the same for every router of a sitting, and for every sitting with `seed`."""
    rng = random.Random(f"{seed}:{conversation}")
    return lambda top: round(rng.uniform(0, top), 3)


def rounds_plan(
    name: str,
    hosts: int,
    conversations: int,
    crowd: int,
    extra: int,
    rounds: int,
    turns: int,
    think: float,
    seed: int,
    max_tokens: int = AGENT_REPLY,
) -> Plan:
    """Conversations that begin one at a time, then rounds in which the busy ones
    (`busy_rounds`) work `turns` turns each at once, thinking before every turn but their
    first of the round, while the others think; replies of up to `max_tokens`."""
    opening = Phase("opening", tuple(range(conversations)), ((0.0,),) * conversations, 1)
    draw = {c: think_times(seed, c) for c in range(conversations)}
    phases = [opening]
    for r, busy in enumerate(busy_rounds(conversations, hosts, rounds, crowd, extra)):
        thinks = tuple((0.0, *(draw[c](think) for _ in range(turns - 1))) for c in busy)
        phases.append(Phase(f"round {r + 1}", busy, thinks, len(busy)))
    workload = Workload(conversations, 1 + rounds * turns, 1, max_tokens, stream=True)
    return Plan(name, hosts, ONE_SLOT_ARGS, conversations, tuple(phases), workload)


def plan_of(
    workload: str,
    rounds: int = 3,
    turns: int | None = None,
    think: float = 2.0,
    seed: int = 37,
    max_tokens: int | None = None,
) -> Plan:
    """The named workload (see the module docstring); `turns` and `max_tokens` None: its
    own defaults."""
    if workload == "overload":
        reply = max_tokens or AGENT_REPLY
        return rounds_plan("overload", 3, 9, 3, 1, rounds, turns or 3, think, seed, reply)
    if workload == "shape":
        reply = max_tokens or AGENT_REPLY
        return rounds_plan("shape", 2, 6, 2, 0, rounds, turns or 3, think, seed, reply)
    if workload == "default":
        streamed = Workload(9, turns or 5, 3, max_tokens or Workload.max_tokens, stream=True)
        phases = tuple(phases_of(streamed))
        return Plan("default", 3, real_cache.LLAMA_ARGS, 9, phases, streamed)
    raise ValueError(f"unknown workload {workload!r} (known: {', '.join(WORKLOADS)})")
