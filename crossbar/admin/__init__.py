"""The admin API (a Klein class), `/metrics` and the dashboard: what the operator sees and the
actions that steer crossbar, each durable before it is acknowledged.
"""
