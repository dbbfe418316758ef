"""Text from outside (a model id a host lists, a path or route a client sent, a key's name) as
it may be written where an operator reads: a log line, a terminal.

A carriage return or line feed in such text would start a forged line of the log; an escape
sequence would reach the operator's terminal. Each such character is written as a Python-style
escape (`\\r`, `\\x1b`, `\\u2028`), as `repr` would, and the rest of the text is left as it came.
"""

from __future__ import annotations

import re

# C0 and C1 controls, DEL, Unicode's line and paragraph separators (which some viewers break
# lines at) and its direction overrides (which make a terminal show text in another order).
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with every control character escaped; itself when it has none (the usual case
    costs one `isprintable` pass)."""
    if text.isprintable():
        return text
    return _UNPRINTABLE.sub(_escape, text)


def printable_lines(text: str) -> str:
    """A formatted log event, whose own line breaks (a traceback's, which twistd indents)
    stay: every other control character in it is escaped."""
    if text.isprintable():
        return text
    return _UNPRINTABLE.sub(lambda m: m.group() if m.group() in "\n\t" else _escape(m), text)
