"""The admin API (a Klein class), `/metrics` and the dashboard: what the operator sees and the
actions that steer crossbar, each durable before it is acknowledged.
"""

from crossbar.admin.api import MAX_BODY, Admin, AdminParts
from crossbar.admin.genai import GenAIMetrics
from crossbar.admin.metrics import Metrics

__all__ = ["MAX_BODY", "Admin", "AdminParts", "GenAIMetrics", "Metrics"]
