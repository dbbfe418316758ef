"""The composition root: every part built from a config and wired (wiring.py), the twistd service
with its start-up order, reload and graceful stop, the sweep, the log lines, the plugin's
options and the `reuseport:` endpoint.
"""

from crossbar.app.logs import json_observer, text_observer
from crossbar.app.reuseport import ReusePortParser

__all__ = ["ReusePortParser", "json_observer", "text_observer"]
