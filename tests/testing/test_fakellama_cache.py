"""The fake's prompt cache: longest prefix wins, displaced caches wait in an LRU, and requests
beyond `parallel` wait their turn."""

from twisted.internet.defer import CancelledError

from crossbar.testing.fakecache import PromptCache, common_prefix


def claimed(d):
    """The Claim a Deferred fired with (the cache answers synchronously when a slot is free)."""
    out = []
    d.addCallback(out.append)
    assert out, "the claim is still waiting"
    return out[0]


def test_common_prefix_counts_shared_leading_tokens():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0


def test_a_request_reuses_the_prefix_its_slot_holds_and_processes_the_rest():
    cache = PromptCache(parallel=1, cache_slots=4)
    first = claimed(cache.claim([1, 2, 3]))
    assert (first.cache_n, first.prompt_n) == (0, 3)
    cache.release(first.slot, [1, 2, 3, 9, 9])  # prompt + reply
    second = claimed(cache.claim([1, 2, 3, 9, 9, 4, 5]))
    assert (second.cache_n, second.prompt_n) == (5, 2)


def test_a_full_hit_still_evaluates_one_token_like_llama_server():
    cache = PromptCache(parallel=1, cache_slots=0)
    cache.release(claimed(cache.claim([1, 2, 3])).slot, [1, 2, 3])
    again = claimed(cache.claim([1, 2, 3]))
    assert (again.cache_n, again.prompt_n) == (2, 1)


def test_the_free_slot_with_the_longest_prefix_is_chosen():
    cache = PromptCache(parallel=2, cache_slots=0)
    a, b = claimed(cache.claim([1, 1])), claimed(cache.claim([2, 2]))
    cache.release(a.slot, [1, 1, 1])
    cache.release(b.slot, [2, 2, 2])
    nxt = claimed(cache.claim([2, 2, 2, 5]))
    assert nxt.slot is b.slot and nxt.cache_n == 3


def test_another_conversation_displaces_a_cache_into_the_lru_and_it_comes_back():
    cache = PromptCache(parallel=1, cache_slots=2)
    a = claimed(cache.claim([1, 2, 3]))
    cache.release(a.slot, [1, 2, 3, 4])
    b = claimed(cache.claim([7, 8]))
    assert b.cache_n == 0 and cache.idle == [[1, 2, 3, 4]]
    cache.release(b.slot, [7, 8, 9])
    back = claimed(cache.claim([1, 2, 3, 4, 5]))
    assert back.cache_n == 4
    assert cache.idle == [[7, 8, 9]]


def test_the_lru_keeps_only_cache_slots_entries_oldest_out_first():
    cache = PromptCache(parallel=1, cache_slots=2)
    for conv in ([1], [2], [3], [4]):
        c = claimed(cache.claim(conv))
        cache.release(c.slot, [*conv, 0])
    assert cache.idle == [[2, 0], [3, 0]]


def test_requests_beyond_parallel_wait_in_order_and_can_leave():
    cache = PromptCache(parallel=1, cache_slots=0)
    first = claimed(cache.claim([1]))
    second, third = cache.claim([2]), cache.claim([3])
    assert cache.queued == 2 and not second.called
    second.addErrback(lambda f: f.trap(CancelledError))
    second.cancel()
    assert cache.queued == 1
    cache.release(first.slot, [1])
    assert claimed(third).slot is first.slot


def test_id_slot_waits_for_that_slot_only():
    cache = PromptCache(parallel=2, cache_slots=0)
    zero = claimed(cache.claim([1], id_slot=0))
    wants_zero = cache.claim([2], id_slot=0)
    other = claimed(cache.claim([3]))
    assert other.slot.id == 1 and not wants_zero.called
    cache.release(zero.slot, [1])
    assert claimed(wants_zero).slot.id == 0


def test_without_cache_prompt_nothing_is_reused():
    cache = PromptCache(parallel=1, cache_slots=4)
    cache.release(claimed(cache.claim([1, 2, 3])).slot, [1, 2, 3])
    assert claimed(cache.claim([1, 2, 3, 4], use_cache=False)).cache_n == 0
