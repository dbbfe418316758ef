"""Test doubles shipped with crossbar (the fake llama-server)."""
