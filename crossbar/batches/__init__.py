"""The OpenAI Batch API on the fleet's spare slots (docs/reference.md, "Batches"): input files
checked line by line (`lines.py`) from a multipart upload (`multipart.py`); the files and
batches' paths on the client port (`desk.py`); their objects and lines in OpenAI's shapes
(`objects.py`); the items claimed from the store and run through the proxy at class `batch`,
their claims renewed, ended batches finalized (`runner.py`).
"""

from crossbar.batches.desk import BatchDesk
from crossbar.batches.lines import ENDPOINTS
from crossbar.batches.objects import batch_object, not_run_line
from crossbar.batches.runner import TICK, BatchRunner

__all__ = ["ENDPOINTS", "TICK", "BatchDesk", "BatchRunner", "batch_object", "not_run_line"]
