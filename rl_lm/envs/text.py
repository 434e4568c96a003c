"""Text from the policy, a tool or an environment, made safe to frame, store and show.

A Python `str` can hold what no file, terminal or tokenizer takes. A lone surrogate (U+D800..U+DFFF: what
`surrogateescape` makes of bytes that are not UTF-8, or what a program's `raise ValueError("\\udcff")` carries
in its message) cannot be encoded as UTF-8 at all: a Rust tokenizer raises TypeError on it, and so do `print`
and `json.dump(..., ensure_ascii=False)` to a UTF-8 file. Control characters encode, but a NUL ends a C string
and an escape sequence or a carriage return rewrites a terminal line. So:

- `first_surrogate` finds what makes a text not text (the episode runner refuses to frame it), and
  `well_formed` replaces it by U+FFFD (as a UTF-8 decoder shows a bad byte), changing nothing else;
- `visible` is what the tools return (the policy reads it) and what transcripts and failure reasons hold:
  `well_formed`, and control characters other than newline and tab written out as escapes (`\\x00`, `\\x1b`),
  so the text is valid Unicode, shows as it is, and keeps the information (the policy sees that its program
  printed a NUL);
- `clip` bounds a text kept for reading (a transcript's huge observation), saying how much was left out.
"""

from __future__ import annotations

import re

_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0 but \t and \n, DEL, C1


def first_surrogate(text: str) -> int:
  """The index of the first lone surrogate in `text` (a character no UTF-8 encoder takes), or -1."""
  found = _SURROGATE.search(text)
  return found.start() if found else -1


def well_formed(text: str) -> str:
  """`text` with every lone surrogate replaced by U+FFFD: valid Unicode, encodable as UTF-8."""
  return _SURROGATE.sub("\ufffd", text)


def visible(text: str) -> str:
  """`well_formed(text)` without control characters (newline and tab kept): each written as its `\\xNN` escape."""
  text = well_formed(text)
  return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def clip(text: str, limit: int) -> str:
  """The first `limit` characters of `text`, and a note of how many more there were."""
  if len(text) <= limit:
    return text
  return f"{text[:limit]}... [{len(text) - limit} more characters]"
