"""The LLM APIs over HTTP, both directions, with no policy: the client dialects (OpenAI, Anthropic,
llama.cpp) and what their bodies say, the errors crossbar answers in them, what a client sent,
the request to a host and its connections, the relay of the host's answer back, and the usage
read from it as it passes. Knows nothing of leases, slots or the store.
"""
