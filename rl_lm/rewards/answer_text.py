"""A completion as the maths answer rules read it: Unicode folded to what the rules know, and the asides.

Unicode (`normalise`). Every numeral is a number, and nothing that changes a value is dropped:
* superscripts are exponents and subscripts indices: "18²" is "18^{2}" (324, not 18), "x₁" is "x_{1}";
* digits of any script (fullwidth "１８", Arabic-Indic "١٨", Devanagari "१८", ...) are ASCII digits;
* every other character with a numeric value is that number, standing alone: "½" is " 1/2 ", "⑱" is " 18 ",
  "Ⅻ" is " 12 ", "十八" is " 10  8 " (so a run of Chinese numerals is several numbers, never silently one);
* invisible format characters (zero-width spaces and joiners, soft hyphens, direction marks) are removed, so
  they cannot split a word ("n\\u200bot") or join two numbers;
* then NFKC (fullwidth and mathematical letters are ASCII letters: "ｎｏｔ", "𝐧𝐨𝐭" read as "not"), and the
  punctuation of CJK text becomes ASCII punctuation followed by a space ("。" is ". "), so sentences end there.
"º" (an ordinal indicator often typed for a degree) is "°". ASCII text is returned unchanged (the common case).

Asides (`aside`). An answer marker does not give the completion's answer where it is:
* "code": inside a fenced code block (```, ~~~; unclosed, to the end) or inline code on its line;
* "quote": inside quotation marks on its line ('He wrote "#### 18"');
* "example": introduced as an example on its line ("e.g. #### 42", "for example", "such as") or by a heading
  on the line before ("For example:" then "#### 42").
These never count: an example on its own ("e.g. #### 42" and nothing else) is no answer, since it shows the
format and does not answer. Two weaker asides count only where the completion has no other answer
(`answers.extract_answer`): "blockquote", a Markdown quote line ("> #### 18"), and "format", a line that names
the format ("In the required format: #### 18"), which a fair model may well write for its own answer.
Every check reads the marker's line and the line before (at most a window of characters), once.
"""
from __future__ import annotations

import bisect
import re
import unicodedata
from fractions import Fraction

_SUPERSCRIPTS = dict(zip("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿⁱ", "0123456789+-=()ni", strict=True))
_SUBSCRIPTS = dict(zip("₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎ₐₑₒₓₙ", "0123456789+-=()aeoxn", strict=True))
_SUPERSCRIPT_RE = re.compile(f"[{''.join(_SUPERSCRIPTS)}]++")
_SUBSCRIPT_RE = re.compile(f"[{''.join(_SUBSCRIPTS)}]++")
_EXTRA_NUMERALS = {"两": 2, "兩": 2, "俩": 2, "倆": 2}  # Chinese "two" without a Unicode numeric value
_BEFORE_NFKC = {
  "º": "°", "。": ". ", "．": ". ", "！": "! ", "？": "? ", "，": ", ", "、": ", ", "；": "; ", "：": ": ", "「": '"',
  "」": '"', "『": '"', "』": '"', "«": '"', "»": '"', "„": '"', "‟": '"', "‹": "'", "›": "'",
}
_AFTER_NFKC = str.maketrans({
  "\u2212": "-", "\u2013": "-", "\u00a0": " ", "\u00d7": "*", "\u2018": "'", "\u2019": "'",
  "\u201c": '"', "\u201d": '"', "\u2026": "...", "\u2044": "/", "\u2215": "/", "\u2236": ":",
})


def _numeral(value: float) -> str:
  f = Fraction(value).limit_denominator(1000)
  return f" {f.numerator} " if f.denominator == 1 else f" {f.numerator}/{f.denominator} "


class _Fold(dict):
  """str.translate table computed on first use of each character."""

  def __missing__(self, code: int) -> str:
    c = chr(code)
    cat = unicodedata.category(c)
    if c in _BEFORE_NFKC:
      out = _BEFORE_NFKC[c]
    elif cat == "Cf":
      out = ""
    elif cat == "Nd":
      out = str(unicodedata.digit(c))
    elif c in _EXTRA_NUMERALS or (cat in ("No", "Nl", "Lo") and unicodedata.numeric(c, None) is not None):
      out = _numeral(_EXTRA_NUMERALS.get(c) or unicodedata.numeric(c))
    else:
      out = c
    if len(self) < 100_000:  # every character a policy can write would be ~1.1M entries: keep the common ones
      self[code] = out
    return out


_FOLD = _Fold()


def normalise(text: str) -> str:
  """The text with numerals, superscripts, invisible characters and compatibility forms folded (module docstring).
  Idempotent; linear in the text."""
  if text.isascii():
    return text
  text = _SUPERSCRIPT_RE.sub(lambda m: "^{" + "".join(_SUPERSCRIPTS[c] for c in m.group()) + "}", text)
  text = _SUBSCRIPT_RE.sub(lambda m: "_{" + "".join(_SUBSCRIPTS[c] for c in m.group()) + "}", text)
  return unicodedata.normalize("NFKC", text.translate(_FOLD)).translate(_AFTER_NFKC)


# --- asides --------------------------------------------------------------------------------------

_FENCE_RE = re.compile(r"(?m)^[ \t]{0,3}+(`{3,}+|~{3,}+)")
_BLOCKQUOTE_RE = re.compile(r"[ \t]*+>")
_EXAMPLE = r"(?:e\.?[ \t]?g\.?(?![A-Za-z])|for[ \t]++(?:example|instance)|examples?+|such[ \t]++as)(?![A-Za-z])"
_EXAMPLE_RE = re.compile(rf"(?i)(?<![A-Za-z]){_EXAMPLE}")  # anywhere before the marker on its line
_EXAMPLE_HEADING_RE = re.compile(rf"(?i)[^A-Za-z]*+{_EXAMPLE}")  # the line before starts with it (and ends in ":")
_FORMAT_RE = re.compile(r"(?i)(?<![A-Za-z])(?:format(?:ted)?+|template|placeholder|syntax|form)(?![A-Za-z])")


def fences(text: str) -> list[tuple[int, int]]:
  """(start, end) of each fenced code block; a fence closes with the same character, at least as long."""
  out, open_at, mark = [], -1, ""
  for m in _FENCE_RE.finditer(text):
    fence = m.group(1)
    if open_at < 0:
      open_at, mark = m.start(), fence
    elif fence[0] == mark[0] and len(fence) >= len(mark):
      out.append((open_at, m.end()))
      open_at = -1
  if open_at >= 0:
    out.append((open_at, len(text)))
  return out


def _inside(blocks: list[tuple[int, int]], pos: int) -> bool:
  i = bisect.bisect_right(blocks, (pos, float("inf"))) - 1
  return i >= 0 and blocks[i][0] <= pos < blocks[i][1]


def aside(text: str, start: int, blocks: list[tuple[int, int]], window: int) -> str:
  """Why the answer marker at `start` is an aside, or "": "code", "quote" and "example" never count as the
  completion's answer; "blockquote" and "format" (a line that names the answer format: "in the format #### 18")
  count only where the completion has no other answer."""
  if _inside(blocks, start):
    return "code"
  line_start = text.rfind("\n", max(0, start - window), start) + 1 or max(0, start - window)
  line_end = text.find("\n", start, start + window)
  lead, rest = text[line_start:start], text[start : start + window if line_end < 0 else line_end]
  if lead.count("`") % 2 and "`" in rest:
    return "code"
  if lead.count('"') % 2 and '"' in rest:
    return "quote"
  prev = text[max(0, line_start - window) : line_start].rstrip()
  prev = prev[prev.rfind("\n") + 1 :]  # the last non-empty line before the marker's line
  if _EXAMPLE_RE.search(lead) or (prev.endswith(":") and _EXAMPLE_HEADING_RE.match(prev)):
    return "example"
  if _BLOCKQUOTE_RE.match(text, line_start) and (line_start == 0 or text[line_start - 1] == "\n"):
    return "blockquote"
  if _FORMAT_RE.search(lead) or (prev.endswith(":") and _FORMAT_RE.search(prev)):
    return "format"
  return ""
