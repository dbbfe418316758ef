"""Per-(host, model) request slots and their fairly shared queues: priorities, weights, per-route
caps, and the release rule of docs/reference.md, "Slots".
"""
