"""Text that reaches a terminal: control characters escaped, so data cannot steer it.

A ``last_error``, a cancel reason or a payload is user data: raw, an escape
sequence in it would clear the screen or recolour it, and a newline would
forge a line of output (``state done``). Every such value goes through
:func:`safe` before it is printed as text (JSON output escapes on its own).
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls, and the Unicode line and paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\x1b"}


def _escape(match: re.Match[str]) -> str:
    char = match[0]
    return _NAMED.get(char) or (
        f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
    )


def safe(value: object) -> str:
    """``value`` as one line of text with every control character escaped."""
    text = str(value)
    text = _CONTROL.sub(_escape, text)
    # A lone surrogate (from a handler's exception text) cannot be written to stdout.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def cut(text: str, width: int) -> str:
    """``text`` at most ``width`` characters, an ellipsis marking a cut."""
    return text if len(text) <= width else text[: width - 1] + "…"
