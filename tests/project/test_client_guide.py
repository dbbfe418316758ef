"""docs/client-guide.md tells each kind of client exactly where crossbar is."""

import pathlib
import re

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "client-guide.md"
CLIENTS = {
    "OpenAI SDK": "http://crossbar:8080/r/convo/v1",
    "Anthropic SDK and Claude Code": "ANTHROPIC_BASE_URL=http://crossbar:8080/r/convo",
    "OpenCode": '"baseURL": "http://crossbar:8080/r/convo/v1"',
    "Codex CLI": 'base_url = "http://crossbar:8080/r/convo/v1"',
    "aider": "--openai-api-base http://crossbar:8080/r/convo/v1",
    "curl": "http://crossbar:8080/r/convo/v1/chat/completions",
    "A browser app": "cors_origins",
}


def sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_client_has_a_section_with_its_exact_base_url_or_variables():
    found = sections(GUIDE.read_text())
    for client, where in CLIENTS.items():
        assert client in found, f"no section for {client}"
        assert where in found[client], f"{client}: no {where!r}"
