"""The LLM APIs over HTTP, both directions, with no policy: the client dialects (OpenAI, Anthropic,
llama.cpp) and what their bodies say, the errors crossbar answers in them, what a client sent,
the request to a host and its connections, the relay of the host's answer back, and the usage
read from it as it passes. Knows nothing of leases, slots or the store.
"""

from crossbar.wire.answer import ReadAnswer, read_body
from crossbar.wire.bodies import canonical, limit_output
from crossbar.wire.continuation import (
    Before,
    Family,
    NotContinued,
    Splice,
    Transcript,
    continuation_body,
)
from crossbar.wire.continuation import family as continuation_family
from crossbar.wire.continuation import refusal as continuation_refusal
from crossbar.wire.dialects import OPENAI_CHAT, Dialect, ErrorShape, Kind, classify
from crossbar.wire.endpoints import HostEndpoints, authorization, no_delay
from crossbar.wire.errors import (
    INTERNAL,
    ClientError,
    bad_request,
    forbidden,
    not_found,
    phrase,
    unauthorized,
    unavailable,
    write_error,
)
from crossbar.wire.escaping import printable, printable_lines
from crossbar.wire.exchange import Exchange
from crossbar.wire.headers import RawHeaders
from crossbar.wire.inbound import (
    HeaderReader,
    Inbound,
    bearer,
    header_reader,
    json_object,
    request_body,
    request_headers,
)
from crossbar.wire.meter import Tokens
from crossbar.wire.relay import ContinuationRelay, KeepingRelay, Relay
from crossbar.wire.reported import MAX_SLOTS, MAX_TOKENS, REPORT_REASONS, count, positive
from crossbar.wire.twisted_private import pull_to_push, quiet_pool, write_now
from crossbar.wire.upstream import (
    CONNECTIONS_BUSY,
    IDEMPOTENCY_HEADERS,
    Outgoing,
    Upstream,
    UpstreamFailure,
    prepare,
    renamed_body,
)

__all__ = [
    "CONNECTIONS_BUSY",
    "IDEMPOTENCY_HEADERS",
    "INTERNAL",
    "MAX_SLOTS",
    "MAX_TOKENS",
    "OPENAI_CHAT",
    "REPORT_REASONS",
    "Before",
    "ClientError",
    "ContinuationRelay",
    "Dialect",
    "ErrorShape",
    "Exchange",
    "Family",
    "HeaderReader",
    "HostEndpoints",
    "Inbound",
    "KeepingRelay",
    "Kind",
    "NotContinued",
    "Outgoing",
    "RawHeaders",
    "ReadAnswer",
    "Relay",
    "Splice",
    "Tokens",
    "Transcript",
    "Upstream",
    "UpstreamFailure",
    "authorization",
    "bad_request",
    "bearer",
    "canonical",
    "classify",
    "continuation_body",
    "continuation_family",
    "continuation_refusal",
    "count",
    "forbidden",
    "header_reader",
    "json_object",
    "limit_output",
    "no_delay",
    "not_found",
    "phrase",
    "positive",
    "prepare",
    "printable",
    "printable_lines",
    "pull_to_push",
    "quiet_pool",
    "read_body",
    "renamed_body",
    "request_body",
    "request_headers",
    "unauthorized",
    "unavailable",
    "write_error",
    "write_now",
]
