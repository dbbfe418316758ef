"""The route tables the stories share: a conversation route over two hosts, and the same with
a one-host route beside it. A story that needs another shape writes its own."""

from tests.support.harness import MODEL

CONVO = {"convo": {"hosts": ["titan", "atlas"], "default_model": MODEL}}
CONVO_AND_SOLO = {**CONVO, "solo": {"hosts": ["titan"], "default_model": MODEL}}
