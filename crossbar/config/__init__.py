"""The TOML config as frozen values: server settings, hosts and their models, routes and
templates, each route's limits, durations and sizes, and how a store URL is shown. Every error
names its dotted path (docs/reference.md, "Config"). Imports nothing of crossbar but records.
"""
