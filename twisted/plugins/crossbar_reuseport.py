"""The `reuseport:` endpoint string prefix: several crossbar processes on one port."""

from crossbar.app import ReusePortParser

reuseport = ReusePortParser()
