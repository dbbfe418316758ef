"""`twistd --logger crossbar.logs.json_observer`, the name operators type (the observer lives in
crossbar.app.logs)."""

from crossbar.app import json_observer

__all__ = ["json_observer"]
