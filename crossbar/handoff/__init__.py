"""Warm hand-off: a conversation moved with its prompt already in its new host's cache (the kept
bodies, the prewarm), evacuating a host, and rebalancing idle conversations off a busy one.
"""
