"""The `reuseport:` endpoint string prefix: several crossbar processes on one port."""

from crossbar.reuseport import ReusePortParser

reuseport = ReusePortParser()
