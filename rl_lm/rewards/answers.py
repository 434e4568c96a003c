"""Maths answers: find the final answer of a completion and refuse what a fair grader would refuse.

Reading. The completion is first folded (`answer_text.normalise`): every Unicode numeral is a number ("１８",
"١٨" are 18; "½" is 1/2; "⑱" is 18; "十八" is two numbers), superscripts are exponents ("18²" is 18^{2}),
invisible characters are removed and compatibility forms are ASCII ("ｎｏｔ" is "not").

Extraction. Answer markers in priority order (configurable): "#### x" (GSM8K; the rest of the line),
"\\boxed{x}" / "\\fbox{x}" (the outermost closed boxes), "The (final) answer is x" (to the end of its sentence,
"." or "!" before a space or the line end, or to an explanation after the number: "because", "since", "which"),
a line "A: x" / "Answer: x" / "Final answer: x" (the rest of the line). The first marker kind with an answer
decides (a span without a number, like the heading "#### Final Answer", is none), and all its answers must agree;
so must a number that an answer of another kind states after it ("#### 18" then "The answer is 19": "conflicting";
one before it is reasoning that the final answer corrects: "the answer is 17? ... \\boxed{18}").
A number elsewhere never counts unless the opt-in last-number fallback is on.
Asides (`answer_text.aside`): a marker in code (a fence or inline), in quotation marks, or introduced as an
example ("e.g. #### 42", "For example:") never counts, even with no other answer (it shows a format; it does not
answer). A marker on a Markdown quote line ("> #### 18") or on a line naming the format ("in the format
#### 18") counts only where there is no other answer.

Refused: score 0, status "ok" (valid), `info["reason"]` naming the rule:
* a negation, hedge, comparison or retraction in the answer span: "not 18", "never", "no", "!18", "18 is wrong",
  "incorrect", "maybe", "perhaps", "probably", "approximately", "about", "around", "roughly", "~18", "≈ 18",
  "18ish", "18?", "18 ± 1", "or" (any alternative), "at least", "at most", "18 or more", "18+", "over", "under",
  "between", "<", ">", "≤", "≥", "≠", "\\neq", "\\le", "\\approx", "\\pm", "\\cancel"; comparatives ("less than
  18", "more than 18") before the number ("5 more apples", after it, states a difference and is fine); retractions
  and corrections ("18 (jk)", "j/k", "18 /s", "lol", "typo", "update", "edit", "actually", "wait"); the same
  words in the common languages of maths data ("nicht 18", "不是18", "約18", "não", "около", "değil",
  `answer_words`). Letters of a non-ASCII script that these rules do not read ("18 años", "18 个") are refused
  in the span ("unreadable"): a fair GSM8K answer never needs them (a single Greek letter is a variable, "μg" a
  unit); a word mixing scripts ("nоt" with a Cyrillic "о") is unreadable anywhere it is read;
* the same signals around the span: in the clause before "the answer is" ("Maybe the answer is 18",
  "I don't think the answer is 18"); in the words leading into a box or "####" through link words ("is not
  \\boxed{18}", "cannot be", "not equal to", "at least", "La respuesta no es", "答案不是"); on the rest of the line
  after a box or after the answer of "the answer is" ("\\boxed{18} is incorrect", "The answer is 18. Or 19.",
  "\\boxed{18} (jk)", a joking or doubting emoji); on the next non-empty lines after the last answer (three of
  them) if one starts a correction or an alternative ("Or 19", "Wait", "Actually", "No", "But", "Update", "Edit"),
  says it is wrong or hedges ("I'm not sure"), jokes ("j/k", "/s", "😜"), or negates or hedges a number ("The
  answer is not 18"). A plain follow-up ("I hope it is correct.", an explanation on the next line) is fine;
* another number after the answer, in any wording: on the rest of the line ("\\boxed{18} update 19",
  "\\boxed{18}, 19", "The answer is 18. Maybe 19.") or in a sentence of those lines ("Update: 19",
  "\\boxed{19}", "It is 19 dollars"). A sentence with "=" and an operator is a calculation, not a second answer
  ("The answer is 18 because 9 * 2 = 18", "Here is why: 16 - 3 - 4 = 9, not 10"; "Total = 19" is one), and
  reading stops at a line that starts a new problem ("Question: Tom has 5 apples...", five words or more, none
  about an answer) or is a special token ("<|endoftext|>"): the next problem is not about this answer;
* more than one number in the span ("#### 17 18", "16-3-4", "1-100", "18 (not 19)", "18 (eighteen)", "18½",
  "十八"; reason "several numbers"); two values joined by a relation or a separator ("18 \\mid 19", "x = 18 = 19",
  "18 \\to 19", "18; 19", "18 \\quad 19", "18 \\\\ 19", "18 & 19", "18 \\Rightarrow 19": "several numbers", or a
  "relation" when every separator is "=", compared only with a gold that is a relation too); "x = 18" (a label) is
  one number; plain arithmetic is unevaluated ("17+1", "2 \\times 9", "-(-18)"; reason "expression"); a list
  "17, 18" only matches a gold that is a list; answers of one marker kind that disagree ("conflicting");
* size: a completion over `max_chars`, an answer span over `max_answer_chars` ("too_long"), more than
  `max_answers` answers of one kind ("too_many"); a closed form too costly to evaluate ("9^{9^{9}}", an exponent
  over 10,000, a factorial or any other function of an argument over 1,000: "(10^{6})!", "\\Gamma(10^{6})",
  "\\binom{10^{6}}{500000}": "too_complex", see `cost.too_costly`). These are the policy's doing.

Accepted as one number: thousands separators "1,000" (and LaTeX "1\\,000"); currency signs and unit words, which
never change the value ("$18", "€18", "18 dollars", "18 eggs per day", "$18/day", "18°", "18kg", "18th"); "18.00",
"018", "+18", "minus 18" (-18), "1.8e1", "18!" (punctuation, not a factorial); fractions "3/4" and "36/2" (a
rational number: 18) and "\\frac{3}{4}"; repeating decimals "0.\\overline{3}", "0.\\bar{3}", "0.(3)",
"0.1\\overline{6}"; LaTeX wrappers ($...$, \\(...\\), nested boxes, \\text{...}, \\left/\\right); a leading label
"x = 18"; a number word when the span has no digits ("eighteen", "twenty-one"); digits of any script ("１８").
Units are not converted ("50 cents" is 50), but the units that change the value are applied: scale words ("18
thousand", "2 dozen", "18k"), and percent: "p%" or "p percent" is p/100 and matches gold p/100 ("25%" = 0.25);
GSM8K writes whole-number percentages without the sign, so it also matches a whole-number gold p ("25%" = 25),
but never a fractional gold p ("0.5%" is 0.005, not 0.5; "12.5%" is not 12.5). A gold with a percent sign
("12.5\\%") matches p with or without the sign, and p/100. Per mille and basis points are refused ("unit").

Time: each step here is linear in the completion (one-pass folding and brace matching, regexes with possessive
quantifiers, at most `max_answers` + 1 spans of each marker kind, context windows of `_WINDOW` characters, word
lists of fixed size); everything per answer works on spans under `max_answer_chars`.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import unicodedata
from fractions import Fraction
from typing import NamedTuple

from rl_lm.rewards.answer_text import aside, fences, normalise
from rl_lm.rewards.answer_words import (
  ALTERNATIVE_EXTRA,
  COMPARATIVE,
  CORRECTION,
  DOUBT,
  HEDGE,
  HEDGE_NEAR,
  JUDGMENT,
  LIMIT,
  LIMIT_NEAR,
  LINK,
  NEGATION,
  NEGATION_NEAR,
  NEGATIVE_WORDS,
  PHRASES,
  RESTART_EXTRA,
  UNSUPPORTED_UNITS,
  is_unspaced,
  unspaced_signal,
)

MARKERS = ("hashes", "boxed", "answer_is", "answer_colon")
_WINDOW = 160  # characters of context read before and after an answer span


@dataclasses.dataclass(frozen=True)
class MathsConfig:
  """How answers are extracted and compared.

  Attributes:
    markers: answer markers to look for, in priority order (subset of MARKERS).
    last_number_fallback: with no marker, take the last number of the text (lenient; off by default).
    symbolic: send non-numeric answers (LaTeX, expressions) to math-verify; otherwise they score 0.
    timeout_s: wall-clock limit of one symbolic comparison.
    workers: symbolic worker processes (and threads for batches).
    max_chars: longer completions score 0 ("too_long").
    max_answer_chars: longer answer spans score 0 ("too_long").
    max_answers: more answers of one marker kind score 0 ("too_many").
    cpu_share: a symbolic overrun whose worker ran on a CPU for this share of `timeout_s` is the answer's fault.
  """

  markers: tuple[str, ...] = MARKERS
  last_number_fallback: bool = False
  symbolic: bool = True
  timeout_s: float = 5.0
  workers: int = 1
  max_chars: int = 50_000
  max_answer_chars: int = 300
  max_answers: int = 16
  cpu_share: float = 0.5


@dataclasses.dataclass(frozen=True)
class Answer:
  """An interpreted answer.

  kind: "number" (exact `value`, `percent` flag), "symbolic", "tuple" or "relation" (compared by math-verify,
  `text`; a tuple or a relation only with a gold of the same kind), "empty" (no number), or refused: "refused"
  (negation, hedge, comparison, retraction, unreadable text), "ambiguous" (several numbers, unevaluated
  arithmetic), "too_long"; `reason` says why.
  """

  kind: str
  value: Fraction | None = None
  percent: bool = False
  text: str = ""
  reason: str = ""


@dataclasses.dataclass(frozen=True)
class Extraction:
  """The answer text found in a completion, the marker that found it and its interpretation, or why there is none."""

  text: str | None
  method: str
  reason: str = ""
  answer: Answer | None = None


# --- words and symbols that change what an answer says (the word lists: `answer_words`) ---------


def _words(s: str) -> frozenset[str]:
  return frozenset(s.split())


def _kinds(**tokens: str) -> dict[str, str]:
  """{token: kind} from each kind's space-separated tokens."""
  return {t: kind for kind, ts in tokens.items() for t in ts.split()}


_CONDITIONAL = _words("if unless whether might could doubt doubtful")
_RESTART = CORRECTION | HEDGE | RESTART_EXTRA
_ALTERNATIVE = _RESTART | ALTERNATIVE_EXTRA  # a different number after one of these is another answer
_NEW_PROBLEM = _words("question q problem exercise example task human user instruction input context passage prompt")
_ABOUT_ANSWERS = _words("answer answers answered result total instead correct correctly right wrong") | CORRECTION
_FOLLOWING_LINES = 3  # non-empty lines read after the final answer for corrections
_NON_SPACE_RE = re.compile(r"\S")
_TONE = _words("s sarc sarcasm j jk joke joking hj hs lh t ij nsrs")  # "18 /s": a tone indicator retracts
_EMOJI = frozenset("😜 😝 😛 🤪 😉 🙃 😏 🤔 🤷 😂 🤣 😅 😆 😬 🙊 🙈 🤡 🤭 🫢 🫣 🤨 🧐 ❌ ✗ ✘ 🚫 ⛔ 👎 ❓ ❔".split())
_LINE_SIGNALS = frozenset(["negation", "hedge", "comparison", "correction", "unreadable"])
_LINK_CMDS = frozenset(["\\(", "\\[", "\\quad", "\\qquad", "\\text", "\\textbf", "\\mathbf", "\\displaystyle"])
_BOUNDARY = frozenset([".", ",", ";", "!", "?", "..."])
_SENTENCE_END = frozenset([".", "!", "?", ";"])
_NUMBER_PREFIXES = frozenset(["$", "€", "£", "¥", "₹", "(", "[", "{", "-", "+", "~"])
_OPERATORS = frozenset(["+", "-", "*", "/", "^", "÷", "\\times", "\\cdot", "\\div", "\\frac"])  # "=" and one: a sum
_CLAUSE_WORDS = _words("so thus therefore hence then but and")
_SEPARATOR_SYMS = frozenset("= ; & : ... → ⇒ ⟹ ⟶ ↦ ← ⇐ ⟸ ↔ ⇔ ⟺ ∣ ≡ ∧ ∩ ⊢ ∴ ∵".split())  # between two answers
_SEPARATOR_CMDS = frozenset(
  "\\mid \\to \\rightarrow \\Rightarrow \\implies \\iff \\Leftrightarrow \\leftrightarrow \\longrightarrow "
  "\\Longrightarrow \\mapsto \\longmapsto \\gets \\leftarrow \\Leftarrow \\longleftarrow \\Longleftarrow "
  "\\impliedby \\equiv \\colon \\coloneqq \\land \\wedge \\cap \\setminus \\ldots \\dots \\cdots \\vdots \\ddots "
  "\\dotsc \\dotsb \\therefore \\because \\vert \\Vert \\parallel \\newline \\cr \\\\ \\&".split()
)
_SIGNAL_SYMS = _kinds(
  comparison="< > <= >= =< ≤ ≥ ≦ ≧ ⩽ ⩾ ≪ ≫ ≲ ≳", negation="≠ !=", hedge="? ≈ ≃ ≅ ∼ ± ∓ +/- +- | ∈ ∉ ∪ ∨"
)
_SIGNAL_CMDS = _kinds(
  negation="\\neq \\ne \\not \\neg \\lnot \\nless \\ngtr \\notin \\cancel \\bcancel \\xcancel \\sout \\st",
  comparison="\\le \\leq \\leqq \\leqslant \\ge \\geq \\geqq \\geqslant \\lt \\gt \\ll \\gg \\lesssim \\gtrsim",
  hedge="\\approx \\approxeq \\sim \\simeq \\cong \\pm \\mp \\lor \\vee \\cup \\in \\subset",
)
_ALLOWED_SYMS = frozenset(". , ! : ; ' \" ` ( ) [ ] { } — ... $ € £ ¥ ₹ ₩ ¢ °".split())  # around one number
_SYMBOLIC_SYMS = frozenset("^ √ π ∞".split())
_PLAIN_OP_CMDS = frozenset(["\\times", "\\cdot", "\\div", "\\ast"])  # arithmetic, not a closed form
_MATH_WORDS = _words("sqrt pi infty log ln sin cos tan exp")
_SCALE = {
  "hundred": 100, "hundreds": 100, "thousand": 1000, "thousands": 1000, "million": 10**6, "millions": 10**6,
  "billion": 10**9, "billions": 10**9, "trillion": 10**12, "dozen": 12, "dozens": 12,
}
_GLUED_SCALE = {"k": 1000, "K": 1000, "M": 10**6, "bn": 10**9}  # "18k", "$2M"
_PERCENT_WORDS = _words("percent percentage pct")
_UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"
_NUMBER_WORDS = {w: i for i, w in enumerate((_UNITS + " seventeen eighteen nineteen").split())} | {
  w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if i > 1
}


def _mark_class() -> str:
  """A regex class of the combining marks of the Basic Multilingual Plane (Indic vowel signs, Arabic harakat,
  accents): they continue a word ("नहीं" is one word, not "नह" and two symbols)."""
  ranges: list[list[int]] = []
  for cp in range(0x300, 0x10000):
    if unicodedata.category(chr(cp))[0] == "M":
      if ranges and ranges[-1][1] == cp - 1:
        ranges[-1][1] = cp
      else:
        ranges.append([cp, cp])
  return "".join(f"\\u{lo:04x}-\\u{hi:04x}" for lo, hi in ranges)


# --- tokens (every pattern is linear: possessive quantifiers, no nested repetition that can backtrack) -----------

_LETTER = rf"[^\W\d_](?:[^\W\d_]|[{_mark_class()}])*+"
_NUM = (
  r"(?:[0-9]{1,3}(?:,[0-9]{3})++(?![0-9])|[0-9]++)(?:\.[0-9]*+(?:\([0-9]++\))?+)?+"
  r"(?:[eE][+-]?+[0-9]{1,3}+(?![0-9]))?+|\.[0-9]++(?:\([0-9]++\))?+"
)
_TOKEN_RE = re.compile(
  rf"(?P<num>(?:{_NUM})(?:[ \t]*+/[ \t]*+(?:{_NUM}))?+)|(?P<cmd>\\(?:[A-Za-z]++|.))"
  rf"|(?P<word>{_LETTER}(?:['\-]{_LETTER})*+)|(?P<sym>!=|<=|>=|=<|\+/-|\+-|\.\.\.|\S)",
  re.S,
)
_HASHES_RE = re.compile(r"#{4,}+[ \t]*+([^\n]*+)")
_ANSWER_IS_RE = re.compile(r"(?i)\b(?:the\s++)?(?:final\s++)?answer\s++is(?![\w'])[ \t]*+:?[ \t]*+(?:\n[ \t]*+)?")
_ANSWER_COLON_RE = re.compile(r"(?im)^[ \t>*#]*+(?:final[ \t]++answer|answer|a)[ \t*]*+:[ \t]*+([^\n]*+)")
_SENTENCE_END_RE = re.compile(r"[.!](?=\s|$)")
_DIGIT_RE = re.compile(r"[0-9]")
_CONNECTIVE_RE = re.compile(
  r"(?i)(?<![ \t])[,;]?+[ \t]++(?:because|since|as|which|given|so|thus|hence|therefore|where|when|due)\b"
)
_BOX_OPEN_RE = re.compile(r"\\(?:boxed|fbox)\s*+\{")
_BRACE_RE = re.compile(r"\\[{}]|[{}]")
_TEXT_CMD_RE = re.compile(
  r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mathit|mathsf|mbox|hbox|operatorname)\s*+\{([^{}]*+)\}"
)
_FRAC_RE = re.compile(
  r"\\[dt]?frac\s*+(?:\{\s*+([-+]?[0-9.,]++)\s*+\}|([0-9]))\s*+(?:\{\s*+([-+]?[0-9.,]++)\s*+\}|([0-9]))"
)
_REPEAT_RE = re.compile(r"(?<=[0-9.])\\(?:overline|bar|dot)\s*+(?:\{([0-9]++)\}|([0-9]))")
_THOUSANDS_SPACE_RE = re.compile(r"(?<=[0-9])\\[,!;: ](?=[0-9]{3}+(?![0-9]))")  # "1\,000"
_SPACING_RE = re.compile(
  r"\\[,!;: ]|\\(?:displaystyle|left|right|big|Big|bigg|Bigg|boxed|fbox)(?![A-Za-z])"
)
_WIDE_SPACE_RE = re.compile(r"\\(?:quad|qquad|enspace|hspace\s*+\{[^{}]*+\})(?![A-Za-z])")  # between two values
_DEGREE_RE = re.compile(r"\^\s*+\{\s*+\\circ\s*+\}|\^\s*+\\circ|\\circ(?![A-Za-z])|\\degree(?![A-Za-z])")


class _Tok(NamedTuple):
  kind: str  # "num" | "cmd" | "word" | "sym"
  text: str
  start: int
  end: int

  @property
  def low(self) -> str:
    return self.text.lower()


def _tokens(s: str) -> list[_Tok]:
  return [_Tok(m.lastgroup or "sym", m.group(), m.start(), m.end()) for m in _TOKEN_RE.finditer(s)]


def _decimal(t: str) -> Fraction | None:
  try:
    if "(" not in t:
      return Fraction(t)
    head, rep = t[:-1].split("(")  # "0.1(6)": non-repeating part "0.1", repeating "6"
    whole, _, frac = head.partition(".")
    digits = (whole or "0") + frac
    return Fraction(int(digits + rep) - int(digits), (10 ** len(rep) - 1) * 10 ** len(frac))
  except (ValueError, ZeroDivisionError):
    return None


def _number_value(t: str) -> Fraction | None:
  """The value of a number token ("1,600", "0.(3)", "1.8e1", "36 / 2"); None for a zero denominator."""
  t = t.replace(",", "").replace(" ", "").replace("\t", "")
  if "/" not in t:
    return _decimal(t)
  num, den = (_decimal(x) for x in t.split("/"))
  return None if num is None or not den else num / den


def _word_value(w: str) -> int | None:
  """The value of a number word ("eighteen", "twenty-one"), or None."""
  parts = w.lower().split("-")
  if len(parts) == 1:
    return _NUMBER_WORDS.get(parts[0])
  if len(parts) == 2 and _NUMBER_WORDS.get(parts[0], 0) >= 20 and 0 < _NUMBER_WORDS.get(parts[1], 0) < 10:
    return _NUMBER_WORDS[parts[0]] + _NUMBER_WORDS[parts[1]]
  return None


@functools.lru_cache(maxsize=4096)
def _script(c: str) -> str:
  """The script of a letter ("LATIN", "CYRILLIC", "CJK" for Han, kana and Hangul), or "" for anything else (a
  modifier letter such as the prolonged sound mark "ー" goes with any script)."""
  if unicodedata.category(c) not in ("Lu", "Ll", "Lt", "Lo"):
    return ""
  name = unicodedata.name(c, "").split(" ")[0].split("-")[0]
  return "CJK" if name in ("CJK", "HIRAGANA", "KATAKANA", "HANGUL", "IDEOGRAPHIC") else name


def _unit_prefix(w: str) -> bool:
  """A micro unit: "μg", "µm" (Greek mu then ASCII letters)."""
  return len(w) > 1 and w[0] in "μµ" and w[1:].isascii() and w[1:].isalpha()


def _mixed_script(w: str) -> bool:
  """A word with letters of two scripts ("nоt" with a Cyrillic "о"): written to slip past the word lists."""
  return not w.isascii() and not _unit_prefix(w) and len({_script(c) for c in w} - {""}) > 1


def _readable(w: str) -> bool:
  """A non-ASCII word the answer rules can read inside an answer span: a Greek letter (a variable), a micro unit."""
  return len(w) == 1 and _script(w) == "GREEK" or _unit_prefix(w)


def _shown(word: str) -> str:
  """A word as a refusal names it: the signal found in a run of unspaced text ("不是"), at most 40 characters."""
  hit = unspaced_signal(word) if is_unspaced(word) else None
  return hit[1] if hit else word[:40]


def _signal(toks: list[_Tok], i: int, *, near: bool, before_number: bool) -> str:
  """The kind of signal ("negation", "hedge", "comparison", "correction", "unit", "unreadable") token i carries,
  or ""."""
  t = toks[i]
  if t.kind == "word":
    prev = toks[i - 1].low if i else ""
    nxt = toks[i + 1].low if i + 1 < len(toks) else ""
    low = t.low
    if (prev, low) in PHRASES:
      return PHRASES[prev, low]
    if is_unspaced(low) and (hit := unspaced_signal(low)):
      return hit[0]
    if _mixed_script(low):
      return "unreadable"
    for w in (low, *low.split("-")) if "-" in low else (low,):  # "18 dollars-ish", "peut-être"
      if w in NEGATION or w.endswith("n't") or w.startswith("n'") or (near and w in NEGATION_NEAR):
        return "negation"
      if w in HEDGE or (near and w in HEDGE_NEAR) or (w == "est" and not before_number):
        return "hedge"  # "18 est." (estimated); "est" before the answer is French for "is"
      if w in LIMIT or (near and w in LIMIT_NEAR) or (before_number and w in COMPARATIVE):
        return "comparison"
      if (w in ("least", "most") and prev == "at") or (w == "up" and nxt == "to"):
        return "comparison"  # "at least", "up to" in any position
      if (w in LIMIT_NEAR or w in COMPARATIVE or w == "up") and prev == "and":
        return "comparison"  # "18 and above", "18 and up", "18 and more"
      if w in CORRECTION:
        return "correction"
      if w in UNSUPPORTED_UNITS:
        return "unit"
  elif t.kind == "cmd":
    return _SIGNAL_CMDS.get(t.text, "")
  elif t.kind == "sym":
    if t.text in _SIGNAL_SYMS:
      return _SIGNAL_SYMS[t.text]
    nxt = toks[i + 1] if i + 1 < len(toks) else None
    if t.text == "~" and nxt is not None and (nxt.kind == "num" or nxt.text in ("-", "+")):
      return "hedge"  # "~18" (a LaTeX "~" elsewhere is a space)
    if t.text == "!" and nxt is not None and nxt.kind == "num" and nxt.start == t.end:
      return "negation"  # "!18"
    if t.text == "+" and (not i or toks[i - 1].kind == "num") and (nxt is None or nxt.kind not in ("num", "cmd")):
      return "comparison"  # "18+", and "\\boxed{18}+"
    if t.text in _EMOJI:
      return "correction"  # a wink, a shrug, a cross: a joke or a doubt
    if t.text == "/" and nxt is not None and nxt.kind == "word" and nxt.start == t.end:
      glued = i and toks[i - 1].end == t.start
      if (not glued and nxt.low in _TONE) or (glued and toks[i - 1].low == "j" and nxt.low == "k"):
        return "correction"  # "18 /s", "/j", "j/k"
  return ""


# --- interpretation of one answer span -----------------------------------------------------------


def _whole_box(s: str) -> str | None:
  """The content of `s` if all of it is one \\boxed{...}."""
  m = _BOX_OPEN_RE.match(s)
  if not m or not s.endswith("}"):
    return None
  depth = 1
  for b in _BRACE_RE.finditer(s, m.end()):
    depth += {"{": 1, "}": -1}.get(b.group(), 0)
    if depth == 0:
      return s[m.end() : b.start()] if b.end() == len(s) else None
  return None


def _strip_wrappers(s: str) -> str:
  s = s.replace("**", " ").replace("__", " ")  # markdown bold ("2**10" becomes two numbers, not 210)
  for _ in range(32):
    before = s
    s = s.strip().strip("*").strip()
    if len(s) >= 2 and s[0] == "$" and s[-1] == "$":
      s = s.strip("$")  # LaTeX delimiters (a currency "$" is ignored later)
    for a, b in (("\\(", "\\)"), ("\\[", "\\]")):
      if s.startswith(a) and s.endswith(b):
        s = s[len(a) : -len(b)]
    s = _whole_box(s) or s
    s = s.rstrip(".").strip()
    if s == before:
      break
  return s


def _delatex(s: str) -> str:
  s = s.replace("\\\\", " \\newline ")  # a line break "\\" first: its second backslash starts no "\ " (a space)
  for _ in range(64):  # \text{\textbf{18}}: innermost first
    s, n = _TEXT_CMD_RE.subn(r" \1 ", s)
    if not n:
      break
  s = s.replace("\\$", "$").replace("\\%", "%").replace("{,}", ",").replace("\\{", "{").replace("\\}", "}")
  s = _THOUSANDS_SPACE_RE.sub(",", s.replace(",\\!", ","))  # "1\,000", "1,\!000" are 1,000; "18\,19" is two numbers
  s = _WIDE_SPACE_RE.sub(" ; ", s)  # "18 \quad 19" separates two values
  s = _SPACING_RE.sub(" ", s)
  s = _DEGREE_RE.sub("°", s)
  s = _FRAC_RE.sub(lambda m: f" {m.group(1) or m.group(2)}/{m.group(3) or m.group(4)} ", s)
  return _REPEAT_RE.sub(lambda m: f"({m.group(1) or m.group(2)})", s)


def _value_word(t: _Tok) -> bool:
  """A word that is a value, not a unit: π, a Greek letter, "pi", "sqrt"."""
  return t.kind == "word" and (t.low in _MATH_WORDS or len(t.text) == 1 and _script(t.text) == "GREEK")


def _is_symbolic(toks: list[_Tok]) -> bool:
  """LaTeX or notation a plain number can't hold: a command, a power, a root, π, a variable."""
  for t in toks:
    if t.kind == "cmd" and t.text not in _PLAIN_OP_CMDS or t.kind == "sym" and t.text in _SYMBOLIC_SYMS:
      return True
    if _value_word(t) or t.kind == "word" and len(t.text) == 1 and t.text.isascii() and t.text not in "aAI":
      return True
  return False


def _is_number(t: _Tok) -> bool:
  return t.kind == "num" or t.kind == "word" and t.low != "one" and _word_value(t.text) is not None


def _separated_values(toks: list[_Tok]) -> tuple[int, bool]:
  """(how many parts of the span between separators hold a number, whether every separator is "="). A
  subscript ("\\sum_{i=1}") is skipped: its "=" separates no values."""
  parts, holds, only_eq, skip, depth = 0, False, True, False, 0
  for i, t in enumerate(toks):
    if depth:
      depth += {"{": 1, "}": -1}.get(t.text, 0) if t.kind == "sym" else 0
      continue
    if skip and t.text == "{":
      skip, depth = False, 1
      continue
    skip = t.text == "_" and i + 1 < len(toks) and toks[i + 1].text == "{"
    if t.kind == "sym" and t.text in _SEPARATOR_SYMS or t.kind == "cmd" and t.text in _SEPARATOR_CMDS:
      parts, holds, only_eq = parts + holds, False, only_eq and t.text == "="
    elif _is_number(t):
      holds = True
  return parts + holds, only_eq


def _applied(toks: list[_Tok], i: int) -> bool:
  """Token i is a word glued to an opening parenthesis: a function applied ("gamma(10)"), not a unit."""
  return toks[i].kind == "word" and i + 1 < len(toks) and toks[i + 1].text == "(" and toks[i + 1].start == toks[i].end


def _one_number(toks: list[_Tok], k: int, s: str) -> Answer:
  """An answer with one number token at k: the number, with its sign, scale and percent, if nothing else counts."""
  sign, percent, scale, eq = 1, False, 1, False
  for i, t in enumerate(toks):
    if t.kind == "word" and i == k - 1 and t.low in NEGATIVE_WORDS:
      sign = -sign
    if _value_word(t) or _applied(toks, i):
      return Answer("symbolic", text=s)  # "2π" is not 2, "gamma(10)" is not 10
    if i == k or t.kind == "word" or t.kind == "sym" and t.text in _ALLOWED_SYMS:
      continue
    nxt = toks[i + 1] if i + 1 < len(toks) else None
    if t.kind == "sym" and i < k:
      if t.text in ("-", "+") and i == k - 1:
        sign = -sign if t.text == "-" else sign
        continue
      if t.text == "=" and not eq:  # a label: "x = 18"
        eq = True
        continue
    elif t.kind == "sym" and i > k:
      if t.text == "%":
        percent = True
        continue
      if t.text in ("-", "/") and nxt is not None and nxt.kind == "word" and nxt.start == t.end:
        continue  # "18-year-old", "$18/day"
    if _is_symbolic(toks):
      return Answer("symbolic", text=s)
    return Answer("ambiguous", text=s, reason="expression")
  value = _number_value(toks[k].text)
  if value is None:
    return Answer("ambiguous", text=s, reason="expression")
  j = k + 1
  if j < len(toks) and toks[j].kind == "word" and toks[j].start == toks[k].end and toks[j].text in _GLUED_SCALE:
    scale, j = _GLUED_SCALE[toks[j].text], j + 1
  while j < len(toks) and toks[j].kind == "word" and toks[j].low in _SCALE:
    scale, j = scale * _SCALE[toks[j].low], j + 1
  for i in range(k + 1, len(toks)):
    w = toks[i].low
    if w in _PERCENT_WORDS or w == "per" and i + 1 < len(toks) and toks[i + 1].low == "cent":
      percent = True
  return Answer("number", sign * value * scale, percent, s)


def interpret(text: str, max_chars: int = 1000) -> Answer:
  """Interprets an answer text: one number, a symbolic expression, a list, a relation, empty, or refused (see the
  module docstring)."""
  s = _strip_wrappers(normalise(text))
  if len(s) > max_chars:
    return Answer("too_long", text=s[:80], reason="too_long")
  toks = _tokens(_delatex(s))
  nums = [i for i, t in enumerate(toks) if t.kind == "num"]
  first = nums[0] if nums else len(toks)
  for i, t in enumerate(toks):
    cat = _signal(toks, i, near=True, before_number=i < first)
    if cat:
      return Answer("refused", text=s, reason=f"{cat}: {_shown(t.text)}")
  for t in toks:  # text in a script the rules can't read ("18 个", "18 años"): a fair answer never needs it
    if t.kind == "word" and not t.text.isascii() and not _readable(t.text):
      return Answer("refused", text=s, reason=f"unreadable: {_shown(t.text)}")
  values, equation = _separated_values(toks)
  if values > 1:  # "18 \mid 19", "x = 18 = 19", "18; 19": two answers, or an equation
    return Answer("relation", text=s) if equation else Answer("ambiguous", text=s, reason="several numbers")
  toks = [t for t in toks if t.text not in ("&", "\\newline")]  # alignment and line breaks around one value
  words = [i for i, t in enumerate(toks) if t.kind == "word" and _word_value(t.text) is not None]
  if nums and any(toks[i].low != "one" for i in words):
    return Answer("ambiguous", text=s, reason="several numbers")  # "18 (eighteen)", "18, nineteen"
  nums = [i for i, t in enumerate(toks) if t.kind == "num"]
  if len(nums) > 1:
    if any(t.text == "," for t in toks):
      return Answer("tuple", text=s)
    if _is_symbolic(toks):
      return Answer("symbolic", text=s)
    arithmetic = any(t.text in ("+", "-", "*", "/", "=") or t.text in _PLAIN_OP_CMDS for t in toks[nums[0] : nums[-1]])
    return Answer("ambiguous", text=s, reason="expression" if arithmetic else "several numbers")
  if nums:
    return _one_number(toks, nums[0], s)
  if len(words) == 1:  # "eighteen": the word read as a number
    k = words[0]
    toks[k] = _Tok("num", str(_word_value(toks[k].text)), toks[k].start, toks[k].end)
    return _one_number(toks, k, s)
  if len(words) > 1:
    return Answer("ambiguous", text=s, reason="several numbers")
  if _is_symbolic(toks):
    return Answer("symbolic", text=s)
  return Answer("empty", text=s, reason="no number")


def numbers_match(gold: Answer, pred: Answer) -> bool:
  """Exact comparison of two numbers; the percent rule of the module docstring."""
  g, p = gold.value, pred.value
  if g is None or p is None:
    return False
  if gold.percent:
    return p == g or (not pred.percent and p * 100 == g)
  if pred.percent:
    return p / 100 == g or (p == g and g.denominator == 1)
  return p == g


# --- context around an answer span ---------------------------------------------------------------


class _Span(NamedTuple):
  text: str  # the answer
  lead: str  # the same line before the marker (at most _WINDOW characters)
  tail: str  # the same line after the answer, for boxes and "the answer is" (at most _WINDOW characters)
  line_end: int  # where the answer's line ends in the completion
  start: int  # where the marker starts


def _line_end(text: str, pos: int) -> int:
  j = text.find("\n", pos)
  return len(text) if j < 0 else j


def _lead(text: str, pos: int) -> str:
  j = text.rfind("\n", max(0, pos - _WINDOW), pos)
  return text[max(0, pos - _WINDOW) if j < 0 else j + 1 : pos]


def _spans(text: str, marker: str, config: MathsConfig) -> list[_Span]:
  """The answer spans of one marker kind (at most max_answers + 1, so a flood costs no more than that)."""
  cap, out = config.max_answers + 1, []
  if marker == "boxed":
    opens = {m.end() - 1: m.start() for m in _BOX_OPEN_RE.finditer(text)}
    stack, closed = [], []
    for m in _BRACE_RE.finditer(text):  # one pass: each "}" closes the last open "{"
      if m.group() == "{":
        stack.append(m.start())
      elif m.group() == "}" and stack:
        o = stack.pop()
        if o in opens:
          closed.append((opens[o], o + 1, m.start()))
    end = -1
    for start, cs, ce in sorted(closed):  # outermost boxes only
      if cs > end and len(out) < cap:
        end = ce
        le = _line_end(text, ce)
        out.append(_Span(text[cs:ce], _lead(text, start), text[ce + 1 : min(le, ce + 1 + _WINDOW)], le, start))
  elif marker in ("hashes", "answer_colon"):
    for m in (_HASHES_RE if marker == "hashes" else _ANSWER_COLON_RE).finditer(text):
      if m.group(1).strip():
        out.append(_Span(m.group(1), _lead(text, m.start()), "", m.end(), m.start()))
      if len(out) >= cap:
        break
  elif marker == "answer_is":
    le = -1
    for m in _ANSWER_IS_RE.finditer(text):
      le = le if le >= m.end() else _line_end(text, m.end())  # many answers on one line: one search
      rest = text[m.end() : min(le, m.end() + config.max_answer_chars + _WINDOW)]
      e = _SENTENCE_END_RE.search(rest)
      span, tail = (rest[: e.start()], rest[e.end() : e.end() + _WINDOW]) if e else (rest, "")
      digit = _DIGIT_RE.search(span)
      because = _CONNECTIVE_RE.search(span, digit.end()) if digit else None
      if because:  # "18 because 9 * 2 = 18": the explanation is context, not the answer
        span, tail = span[: because.start()], span[because.start() : because.start() + _WINDOW] + " " + tail
      if span.strip():
        out.append(_Span(span, _lead(text, m.start()), tail, le, m.start()))
      if len(out) >= cap:
        break
  else:
    raise ValueError(f"unknown answer marker {marker!r}; known: {MARKERS}")
  return out


def _walk_lead(lead: str, answer: Answer) -> str:
  """A signal in the words that lead into a box or "####" ("is not", "cannot be", "not equal to", "at least",
  "no es", "答案不是"), or another value joined to it ("19 \\mid \\boxed{18}", "19 = \\boxed{18}"; a calculation
  "9 \\times 2 = \\boxed{18}" is fine). A Markdown quote mark at the start of the line is no comparison."""
  if lead.lstrip().startswith(">"):
    lead = lead.lstrip(" \t>")
  toks = _tokens(lead)
  for i, t in reversed(list(enumerate(toks))):
    if t.kind == "sym" and t.text in _BOUNDARY:
      return _hedge_before(toks, i)
    separator = t.kind == "sym" and t.text in _SEPARATOR_SYMS and t.text != ":" or t.text in _SEPARATOR_CMDS
    if separator and _joined_value(toks, i, answer):  # ("Step 3: \\boxed{18}" is a label)
      return "several numbers"
    if t.kind == "word" and is_unspaced(t.text):  # "答案不是": read the words just before the marker
      cat = _signal([t._replace(text=t.text[-6:])], 0, near=True, before_number=True)
    else:
      cat = _signal(toks, i, near=True, before_number=True)
    if cat and cat != "correction":  # a correction before the answer leads into it ("Actually \\boxed{18}")
      return f"{cat}: {_shown(t.text[-6:] if is_unspaced(t.text) else t.text)}"
    if not (t.kind == "word" and t.low in LINK or t.kind == "sym" or t.text in _LINK_CMDS):
      return ""  # punctuation is transparent ("not / \\boxed{18}"); another word ends the walk
  return ""


def _joined_value(toks: list[_Tok], i: int, answer: Answer) -> bool:
  """Separator i has another value right before it: a lone number ("19 \\mid", "x = 19 ="), not the result of a
  calculation ("9 \\times 2 =", "36/2 =")."""
  j = i - 1
  while j >= 0 and toks[j].text in ("$", "{", "}", "(", ")", "\\(", "\\[", "\\left", "\\right"):
    j -= 1
  if j < 0 or not _is_number(toks[j]) or not _other_number(toks, j, answer):
    return False
  # "19 \mid", "x = 19 =": another value; "9 \times 2 =", "36/2 =": a calculation of this one
  return toks[i].text != "=" or not ("/" in toks[j].text or _binary_operator(toks, j - 1))


def _hedge_before(toks: list[_Tok], i: int) -> str:
  """A hedge word that ends the clause before boundary i ("Maybe, \\boxed{18}", "Perhaps, the answer is 18")."""
  if i and toks[i - 1].kind == "word" and _signal(toks, i - 1, near=False, before_number=False) == "hedge":
    return f"hedge: {_shown(toks[i - 1].text)}"
  return ""


def _clause_lead(lead: str) -> str:
  """A negation, hedge or condition in the clause before "the answer is" ("Maybe", "I don't think", "If")."""
  toks = _tokens(lead)
  start = max((i + 1 for i, t in enumerate(toks) if t.text in _BOUNDARY or t.low in _CLAUSE_WORDS), default=0)
  if start and toks[start - 1].text in _BOUNDARY and (hedge := _hedge_before(toks, start - 1)):
    return hedge
  for i, t in enumerate(toks[start:], start):
    cat = _signal(toks, i, near=False, before_number=False)
    if cat in ("negation", "hedge", "unreadable") or t.low in _CONDITIONAL:
      return f"{cat or 'hedge'}: {t.text}"
  return ""


def _other_number(toks: list[_Tok], i: int, answer: Answer) -> bool:
  """Token i is a number (or number word) other than the answer."""
  t = toks[i]
  if t.kind == "num":
    value = _number_value(t.text)
  elif t.kind == "word" and t.low != "one" and _word_value(t.text) is not None:
    value = Fraction(_word_value(t.text))
  else:
    return False
  if value is not None and i and toks[i - 1].text == "-":
    value = -value
  return answer.kind != "number" or value != answer.value


def _sentences(toks: list[_Tok]) -> list[tuple[int, int]]:
  """(start, end) token ranges of the sentences ("." "!" "?" ";" end one)."""
  out, start = [], 0
  for i, t in enumerate(toks):
    if t.kind == "sym" and t.text in _SENTENCE_END:
      out.append((start, i))
      start = i + 1
  return [*out, (start, len(toks))]


def _states_another(toks: list[_Tok], answer: Answer) -> str:
  """A sentence that states a number other than the answer, or negates or hedges a number ("Update: 19", "It is
  19 dollars", "Total = 19", "not 18"). A calculation ("=" and an operator: "16 - 3 - 4 = 9") states nothing."""
  for a, b in _sentences(toks):
    if _calculation(toks[a:b]):
      continue
    for i in range(a, b):
      if _other_number(toks, i, answer):
        return "several numbers"
      j = i + 1
      while j < b and toks[j].kind == "sym" and toks[j].text in _NUMBER_PREFIXES:
        j += 1
      if j < b and _is_number(toks[j]):  # "not 18", "maybe $18"
        cat = _signal(toks, i, near=False, before_number=True)
        if cat in ("negation", "hedge", "comparison"):
          return f"{cat}: {_shown(toks[i].text)}"
  return ""


def _calculation(toks: list[_Tok]) -> bool:
  """An "=" and a binary operator ("16 - 3 - 4 = 9"; not "Total = -2")."""
  return any(t.text == "=" for t in toks) and any(_binary_operator(toks, k) for k in range(len(toks)))


def _binary_operator(toks: list[_Tok], k: int) -> bool:
  """Token k is an arithmetic operator between two operands ("3 - 4", "(2) \\times 9"; not the sign of "-2")."""
  return (
    0 < k < len(toks) - 1
    and toks[k].text in _OPERATORS
    and (toks[k - 1].kind in ("num", "word") or toks[k - 1].text in (")", "}"))
  )


def _tail_refusal(tail: str, answer: Answer) -> str:
  """A signal on the rest of the answer's line, a clause there that starts a correction ("but", "wait") or with
  another number, another number after an alternative word ("it could also be 19"), or any other number outside
  a calculation ("\\boxed{18} update 19")."""
  toks = _tokens(tail)
  clause_start, alternative = True, False
  for i, t in enumerate(toks):
    cat = _signal(toks, i, near=False, before_number=False) or ("correction" if t.low in CORRECTION else "")
    if cat:
      return f"{cat}: {_shown(t.text)}"
    if clause_start and t.low in _RESTART:
      return f"correction: {t.text}"
    if (clause_start or alternative) and _other_number(toks, i, answer):
      return "several numbers"
    alternative = alternative or t.low in _ALTERNATIVE
    if t.text in _BOUNDARY:
      clause_start = True
    elif not (t.kind == "sym" and t.text in ("(", "[", "{", "$", "=", ":", "-", "+", "*")):
      clause_start = False
  return _states_another(toks, answer)


def _following_refusal(text: str, pos: int, answer: Answer) -> str:
  """`_line_refusal` on each of the next `_FOLLOWING_LINES` non-empty lines after the final answer, up to one that
  starts a new problem or is a special token."""
  for _ in range(_FOLLOWING_LINES):
    m = _NON_SPACE_RE.search(text, pos)
    if m is None:
      return ""
    pos = _line_end(text, m.start())
    why, stop = _line_refusal(text[m.start() : min(pos, m.start() + _WINDOW)], answer)
    if why or stop:
      return why
  return ""


def _line_refusal(line: str, answer: Answer) -> tuple[str, bool]:
  """(why a line after the answer refuses it, whether reading stops here). It refuses if it starts a correction or
  an alternative ("Or 19", "Wait", "No", "Update"), says the answer is wrong or hedges, jokes ("😜", "/s"), or
  states another number (`_states_another`). A special token ("<|endoftext|>") or a new problem ("Question: Tom
  has 5 apples...", five words or more, none about an answer) ends what is read."""
  if line.startswith(("<|", "</", "<eos", "<end", "<EOS")):
    return "", True
  toks = _tokens(line)
  body = [t for t in toks if t.kind != "sym" or t.text in _SIGNAL_SYMS or t.text in _BOUNDARY or t.text == ":"]
  while body and body[0].kind == "sym" and body[0].text not in _SIGNAL_SYMS:
    body.pop(0)  # markdown bullets and quotes aside
  for i, t in enumerate(toks):  # "😜", "/s", "j/k" anywhere on the line
    if t.kind == "sym" and _signal(toks, i, near=False, before_number=False) == "correction":
      return f"correction: {t.text}", True
  if not body:
    return "", False
  first = body[0]
  if first.kind == "word" and first.low in _RESTART:
    return f"correction: {first.text}", True
  if first.kind == "word" and is_unspaced(first.text):
    hit = unspaced_signal(first.text[:8])  # "不对，是19": how the line starts
    if hit:
      return f"{hit[0]}: {hit[1]}", True
  elif (cat := _signal(body, 0, near=False, before_number=False)) in _LINE_SIGNALS:
    return f"{cat}: {_shown(first.text)}", True
  words = [t.low for t in body if t.kind == "word"]
  if first.low in _NEW_PROBLEM and len(words) >= 5 and not any(w in _ABOUT_ANSWERS for w in words):
    return "", True  # "Question: Is it 5 or 6? Maybe 5.": the next problem, not this answer
  lone = len(body) <= 4
  cut = next((j for j, t in enumerate(body) if j and t.text in (".", "?", "!", ":", ";")), len(body))
  head = body[: min(cut, 8)]  # its first sentence: "That is wrong.", "I'm not sure." ("Question: Maybe 5?" is no hedge)
  judged = next((t for t in head if t.kind == "word" and t.low in JUDGMENT), None)
  if judged is not None:
    return f"negation: {judged.text}", True
  for j, t in enumerate(head):  # "I'm not sure.", "Probably."
    after = head[j + 1].low if j + 1 < len(head) else ""
    if t.low in HEDGE - {"or", "either", "ish"} or (t.low in NEGATION and after in DOUBT):
      return f"hedge: {t.text}", True
  if lone and _other_number(body, 0, answer):
    return "several numbers", True
  return _states_another(toks, answer), False


def _agree(a: Answer, b: Answer) -> bool:
  """Two answers of different marker kinds say the same: equal numbers (either read as a percent), or anything
  that is not a plain number (compared by nobody here; only numbers can be seen to disagree)."""
  if a.kind != "number" or b.kind != "number":
    return True
  return numbers_match(a, b) or numbers_match(b, a)


def _decide(text: str, spans: dict[str, list[_Span]], counts: dict[str, int], config: MathsConfig) -> Extraction | None:
  """The answer of the first marker kind with one, checked against its context and the other kinds' numbers."""
  for marker in config.markers:
    if not spans[marker]:
      continue
    if counts[marker] > config.max_answers:
      return Extraction(None, marker, "too_many")
    found = []
    for span in spans[marker]:
      if len(span.text) > config.max_answer_chars:
        return Extraction(None, marker, "too_long")
      a = interpret(span.text, config.max_answer_chars)
      if a.kind in ("refused", "ambiguous", "too_long"):
        return Extraction(None, marker, a.reason or a.kind)
      if a.kind != "empty":  # a heading "#### Final Answer", an empty box: not an answer
        found.append((span, a))
    for k, (span, a) in enumerate(found):
      lead = _clause_lead(span.lead) if marker == "answer_is" else _walk_lead(span.lead, a)
      why = (
        (lead and f"{lead} (before the answer)")
        or _tail_refusal(span.tail, a)
        or (k == len(found) - 1 and _following_refusal(text, span.line_end, a))
      )
      if why:
        return Extraction(None, marker, why)
    if not found:
      continue
    keys = {(a.kind, a.value, a.percent) if a.kind == "number" else (a.kind, a.text) for _, a in found}
    if len(keys) > 1:
      return Extraction(None, marker, "conflicting")
    last, answer = found[-1]
    for other in config.markers:  # "#### 18" then "The answer is 19": a correction, two final answers
      later = [s for s in spans[other] if s.start > last.start] if other != marker else []
      if any(len(s.text) <= config.max_answer_chars and not _agree(answer, interpret(s.text)) for s in later):
        return Extraction(None, marker, f"conflicting ({other})")
    return Extraction(last.text.strip(), marker, answer=answer)
  return None


def extract_answer(completion: str, config: MathsConfig = MathsConfig()) -> Extraction:
  """The final answer of a completion and its interpretation, or why there is none (see the module docstring)."""
  if len(completion) > config.max_chars:
    return Extraction(None, "none", "too_long")
  text = normalise(completion)
  blocks = fences(text)
  found = {m: _spans(text, m, config) for m in config.markers}
  counts = {m: len(s) for m, s in found.items()}
  asides = {m: [(s, aside(text, s.start, blocks, _WINDOW)) for s in spans] for m, spans in found.items()}
  plain = {m: [s for s, a in spans if not a] for m, spans in asides.items()}
  quoted = {m: [s for s, a in spans if a in ("", "blockquote", "format")] for m, spans in asides.items()}
  decided = _decide(text, plain, counts, config)  # answers outside asides first; quoted ones only without them
  if decided is None and quoted != plain:
    decided = _decide(text, quoted, counts, config)
  if decided is not None:
    return decided
  if config.last_number_fallback:
    toks = _tokens(text)
    k = max((i for i, t in enumerate(toks) if t.kind == "num"), default=None)
    if k is not None:
      glued_minus = k and toks[k - 1].text == "-" and toks[k - 1].end == toks[k].start
      number = ("-" if glued_minus else "") + toks[k].text
      return Extraction(number, "last_number", answer=interpret(number))
  seen = any(a in ("code", "quote", "example") for spans in asides.values() for _, a in spans)
  return Extraction(None, "none", "no_answer (only in an example, a quote or code)" if seen else "no_answer")
