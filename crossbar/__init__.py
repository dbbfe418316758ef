"""crossbar: a sticky reverse proxy for a fleet of llama.cpp llama-server hosts."""

__version__ = "0.1.0"
