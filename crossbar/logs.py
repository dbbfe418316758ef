"""`twistd --logger crossbar.logs.text_observer` or `crossbar.logs.json_observer`, the names
operators type (the observers live in crossbar.app.logs)."""

from crossbar.app import json_observer, text_observer

__all__ = ["json_observer", "text_observer"]
