"""One crossbar's request path: its overhead over the host (`overhead.py`), its rate against
nginx (`proxy_rate.py`), many streams (`streams.py`, their source `sse_source.py`), what bodies
cost in memory (`body_memory.py`), and how long a freed slot stands idle (`slot_handoff.py`, its
stage, host, figures and stamps: `slot_handoff_stage.py`, `slot_host.py`, `handoff_figures.py`,
`crossbar_stamps.py`)."""
