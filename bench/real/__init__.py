"""Benches on real llama-servers (`make real`'s build and model): how much prompt each router
makes them prefill (`real_cache.py`), the valve's waits and moves (`real_valve.py`, its schedules
`valve_workloads.py`), router-mode fleets' model loads (`real_models.py`), agents beside a
batch flood by request class (`real_classes.py`), a Batch API batch alone and beside agents
against a thread-pool script (`real_batches.py`, its workload `batch_workload.py`, its two
clients `batch_clients.py`), a host killed mid-answer beside the peers (`real_resume.py`), and
the agent workload they share
(`agent_workload.py`)."""
