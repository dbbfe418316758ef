"""The `crossbar` command: `check` a config, `ctl` a running crossbar over its admin API (plain
blocking HTTP: short-lived processes), `migrate-store`.
"""
