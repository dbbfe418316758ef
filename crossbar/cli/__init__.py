"""The `crossbar` command: `init` a config from what llama-servers say they serve, `check` a
config, `ctl` a running crossbar over its admin API (plain blocking HTTP: short-lived
processes), `migrate-store`.
"""
