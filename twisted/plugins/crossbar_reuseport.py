"""The `reuseport:` endpoint string prefix: several crossbar processes on one port."""

from crossbar.app.reuseport import ReusePortParser

reuseport = ReusePortParser()
