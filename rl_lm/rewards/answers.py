"""Maths answers: find the final answer of a completion and refuse what a fair grader would refuse.

Extraction. Answer markers in priority order (configurable): "#### x" (GSM8K; the rest of the line),
"\\boxed{x}" / "\\fbox{x}" (the outermost closed boxes), "The (final) answer is x" (to the end of its sentence,
"." or "!" before a space or the line end, or to an explanation after the number: "because", "since", "which"),
a line "A: x" / "Answer: x" / "Final answer: x" (the rest of the line). The first marker kind with an answer
decides (a span without a number, like the heading "#### Final Answer", is none), and all its answers must agree.
A number elsewhere never counts unless the opt-in last-number fallback is on.

Refused: score 0, status "ok" (valid), `info["reason"]` naming the rule:
* a negation, hedge or comparison in the answer span: "not 18", "never", "no", "!18", "18 is wrong", "incorrect",
  "maybe", "perhaps", "probably", "approximately", "about", "around", "roughly", "~18", "≈ 18", "18ish", "18?",
  "18 ± 1", "or" (any alternative), "at least", "at most", "18 or more", "18+", "over", "under", "between", "<",
  ">", "≤", "≥", "≠", "\\neq", "\\le", "\\approx", "\\pm", "\\cancel"; comparatives ("less than 18", "more than 18")
  before the number ("5 more apples", after it, states a difference and is fine);
* the same signals around the span: in the clause before "the answer is" ("Maybe the answer is 18",
  "I don't think the answer is 18"); in the words leading into a box or "####" through link words ("is not
  \\boxed{18}", "cannot be", "not equal to", "at least"); on the rest of the line after a box or after the
  answer of "the answer is" ("\\boxed{18} is incorrect", "The answer is 18. Or 19.", a clause there that starts
  with a different number, "\\boxed{18}, 19", or a different number after "could", "also", "maybe": "18; it
  could also be 19"); on the next non-empty line after the last answer if it starts a correction or an
  alternative ("Or 19", "Wait", "Actually", "No", "But"), says it is wrong or hedges ("I'm not sure"), or is
  another number. A plain follow-up ("I hope it is correct.", an explanation on the next line) is fine;
* more than one number in the span ("#### 17 18", "16-3-4", "1-100", "18 (not 19)", "18 (eighteen)"; reason
  "several numbers"); plain arithmetic is unevaluated ("17+1", "2 \\times 9", "-(-18)"; reason "expression"); a
  list "17, 18" only matches a gold that is a list; answers of one marker kind that disagree ("conflicting");
* size: a completion over `max_chars`, an answer span over `max_answer_chars` ("too_long"), more than
  `max_answers` answers of one kind ("too_many"); a closed form too costly to evaluate ("9^{9^{9}}", an exponent
  over 10,000, a factorial over 1,000: "too_complex", see `too_costly`). These are the policy's doing.

Accepted as one number: thousands separators "1,000"; currency signs and unit words, which never change the
value ("$18", "€18", "18 dollars", "18 eggs per day", "$18/day", "18°", "18kg", "18th"); "18.00", "018", "+18",
"minus 18" (-18), "1.8e1", "18!" (punctuation, not a factorial); fractions "3/4" and "36/2" (a rational number:
18) and "\\frac{3}{4}"; repeating decimals "0.\\overline{3}", "0.\\bar{3}", "0.(3)", "0.1\\overline{6}"; LaTeX
wrappers ($...$, \\(...\\), nested boxes, \\text{...}, \\left/\\right); a leading label "x = 18"; a number word
when the span has no digits ("eighteen", "twenty-one"). Units are not converted ("50 cents" is 50), but
the units that change the value are applied: scale words ("18 thousand", "2 dozen", "18k"), and percent: "p%"
or "p percent" is p/100 and matches gold p/100 ("25%" = 0.25); GSM8K writes whole-number percentages without
the sign, so it also matches a whole-number gold p ("25%" = 25), but never a fractional gold p ("0.5%" is 0.005,
not 0.5; "12.5%" is not 12.5). A gold with a percent sign ("12.5\\%") matches p with or without the sign, and
p/100. Per mille and basis points are refused ("unit").

Time: each step here is linear in the completion (one-pass brace matching with a stack, regexes with
possessive quantifiers, at most `max_answers` + 1 spans, context windows of `_WINDOW` characters); everything
per answer works on spans under `max_answer_chars`.
"""
from __future__ import annotations

import dataclasses
import re
from fractions import Fraction
from typing import NamedTuple

MARKERS = ("hashes", "boxed", "answer_is", "answer_colon")
_WINDOW = 160  # characters of context read before and after an answer span
_UNICODE = str.maketrans({
  "\u2212": "-", "\u2013": "-", "\u00a0": " ", "\u2009": " ", "\u202f": " ", "\u00d7": "*", "\u2018": "'",
  "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2026": "...",
})


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

  kind: "number" (exact `value`, `percent` flag), "symbolic" or "tuple" (compared by math-verify, `text`),
  "empty" (no number), or refused: "refused" (negation, hedge, comparison), "ambiguous" (several numbers,
  unevaluated arithmetic), "too_long"; `reason` says why.
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


# --- words and symbols that change what an answer says -------------------------------------------


def _words(s: str) -> frozenset[str]:
  return frozenset(s.split())


def _kinds(**tokens: str) -> dict[str, str]:
  """{token: kind} from each kind's space-separated tokens."""
  return {t: kind for kind, ts in tokens.items() for t in ts.split()}


# "near" sets count inside an answer span and in the words leading into it; elsewhere they are ordinary prose.
_NEGATION = _words(
  "not no never nope nah cannot wrong wrongly incorrect incorrectly untrue invalid false falsely mistake mistaken "
  "erroneous bogus error impossible miscalculated miscounted"
)
_NEGATION_NEAR = _words("but none neither nor without except excluding besides unlike instead rather different")
_HEDGE = _words(
  "or either maybe perhaps probably possibly presumably approximately approx approximate roughly circa unsure "
  "uncertain guess guessing estimate estimated est ballpark ish"
)
_HEDGE_NEAR = _words(
  "about around nearly almost ca likely unlikely might could some somewhere something if unless whether depending "
  "depends close plus range ranging between possible unclear think believe suppose assume assuming order "
  "confidence confident"
)
_LIMIT = _words("atleast atmost upto upwards onwards tops")
_LIMIT_NEAR = _words(
  "least most max maximum min minimum over under above below beyond exceeding exceeds exceed within shy short"
)
_COMPARATIVE = _words("more less fewer greater larger smaller bigger higher lower than")  # refused before the number
_CORRECTION = _words(
  "actually wait alternatively correction oops sorry otherwise hmm scratch retract disregard nevermind"
)
_CONDITIONAL = _words("if unless whether might could doubt doubtful")
_RESTART = _CORRECTION | _HEDGE | _words("no not nope never but however though although instead rather unless")
_ALTERNATIVE = _RESTART | _words(  # a different number after one of these is another answer
  "also could might may else possibility possibilities possible alternative option options"
)
_JUDGMENT = _words("wrong incorrect untrue mistake mistaken erroneous invalid bogus kidding joking")
_DOUBT = _words("sure certain confident convinced")  # "not sure"
_NEGATIVE_WORDS = _words("minus negative")  # "minus 18" is -18
_UNSUPPORTED_UNITS = _words("mille permille permil bps basis")  # would change the value; not interpreted
_LINK = _words(
  "is are was were be being been equal equals to exactly quite really just simply necessarily going gonna the a "
  "an answer final result total value it its it's this that so thus therefore hence then we get gives would will "
  "should must definitely certainly surely clearly obviously as"
)
_LINK_SYMS = frozenset(["$", "=", ":", "(", "[", "{", "}", "*"])
_LINK_CMDS = frozenset(["\\(", "\\[", "\\quad", "\\qquad", "\\text", "\\textbf", "\\mathbf", "\\displaystyle"])
_BOUNDARY = frozenset([".", ",", ";", "!", "?", "..."])
_CLAUSE_WORDS = _words("so thus therefore hence then but and")
_SIGNAL_SYMS = _kinds(
  comparison="< > <= >= =< ≤ ≥ ⩽ ⩾ ≪ ≫ ≲ ≳", negation="≠ !=", hedge="? ≈ ≃ ≅ ∼ ± ∓ +/- +- | ∈ ∉ ∪ ∨"
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

# --- tokens (every pattern is linear: possessive quantifiers, no nested repetition that can backtrack) -----------

_NUM = (
  r"(?:[0-9]{1,3}(?:,[0-9]{3})++(?![0-9])|[0-9]++)(?:\.[0-9]*+(?:\([0-9]++\))?+)?+"
  r"(?:[eE][+-]?+[0-9]{1,3}+(?![0-9]))?+|\.[0-9]++(?:\([0-9]++\))?+"
)
_TOKEN_RE = re.compile(
  rf"(?P<num>(?:{_NUM})(?:[ \t]*+/[ \t]*+(?:{_NUM}))?+)|(?P<cmd>\\(?:[A-Za-z]++|.))"
  r"|(?P<word>[^\W\d_]++(?:['\-][^\W\d_]++)*+)|(?P<sym>!=|<=|>=|=<|\+/-|\+-|\.\.\.|\S)",
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
_SPACING_RE = re.compile(
  r"\\[,!;: ]|\\(?:quad|qquad|displaystyle|left|right|big|Big|bigg|Bigg|boxed|fbox)(?![A-Za-z])"
)
_CARET_RE = re.compile(r"\^\s*+")
_UNBRACED_TOWER_RE = re.compile(r"[0-9A-Za-z.]++\s*+\^")
_EXPONENT_RE = re.compile(r"\^\s*+\{?\s*+([0-9]{1,300}+)|[0-9.][eE][+-]?+([0-9]{1,300}+)")
_FACTORIAL_RE = re.compile(r"(?<![0-9])([0-9]{1,300}+)\s*+!")
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


def _signal(toks: list[_Tok], i: int, *, near: bool, before_number: bool) -> str:
  """The kind of signal ("negation", "hedge", "comparison") token i carries, or ""."""
  t = toks[i]
  if t.kind == "word":
    prev = toks[i - 1].low if i else ""
    nxt = toks[i + 1].low if i + 1 < len(toks) else ""
    for w in t.low.split("-"):  # "18 dollars-ish"
      if w in _NEGATION or w.endswith("n't") or (near and w in _NEGATION_NEAR):
        return "negation"
      if w in _HEDGE or (near and w in _HEDGE_NEAR):
        return "hedge"
      if w in _LIMIT or (near and w in _LIMIT_NEAR) or (before_number and w in _COMPARATIVE):
        return "comparison"
      if (w in ("least", "most") and prev == "at") or (w == "up" and nxt == "to"):
        return "comparison"  # "at least", "up to" in any position
      if (w in _LIMIT_NEAR or w in _COMPARATIVE or w == "up") and prev == "and":
        return "comparison"  # "18 and above", "18 and up", "18 and more"
      if w in _UNSUPPORTED_UNITS:
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
  for _ in range(64):  # \text{\textbf{18}}: innermost first
    s, n = _TEXT_CMD_RE.subn(r" \1 ", s)
    if not n:
      break
  s = s.replace("\\$", "$").replace("\\%", "%").replace("{,}", ",").replace("\\{", "{").replace("\\}", "}")
  s = _SPACING_RE.sub(lambda m: "" if len(m.group()) == 2 else " ", s)
  s = _DEGREE_RE.sub("°", s)
  s = _FRAC_RE.sub(lambda m: f" {m.group(1) or m.group(2)}/{m.group(3) or m.group(4)} ", s)
  return _REPEAT_RE.sub(lambda m: f"({m.group(1) or m.group(2)})", s)


def _is_symbolic(toks: list[_Tok]) -> bool:
  """LaTeX or notation a plain number can't hold: a command, a power, a root, π, a variable."""
  for t in toks:
    if t.kind == "cmd" and t.text not in _PLAIN_OP_CMDS or t.kind == "sym" and t.text in _SYMBOLIC_SYMS:
      return True
    if t.kind == "word" and (t.low in _MATH_WORDS or (len(t.text) == 1 and t.text.isascii() and t.text not in "aAI")):
      return True
  return False


def _one_number(toks: list[_Tok], k: int, s: str) -> Answer:
  """An answer with one number token at k: the number, with its sign, scale and percent, if nothing else counts."""
  sign, percent, scale, eq = 1, False, 1, False
  for i, t in enumerate(toks):
    if t.kind == "word" and i == k - 1 and t.low in _NEGATIVE_WORDS:
      sign = -sign
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
  """Interprets an answer text: one number, a symbolic expression, a list, empty, or refused (see module docstring)."""
  s = _strip_wrappers(text.translate(_UNICODE))
  if len(s) > max_chars:
    return Answer("too_long", text=s[:80], reason="too_long")
  toks = _tokens(_delatex(s))
  nums = [i for i, t in enumerate(toks) if t.kind == "num"]
  first = nums[0] if nums else len(toks)
  for i, t in enumerate(toks):
    cat = _signal(toks, i, near=True, before_number=i < first)
    if cat:
      return Answer("refused", text=s, reason=f"{cat}: {t.text}")
  words = [i for i, t in enumerate(toks) if t.kind == "word" and _word_value(t.text) is not None]
  if nums and any(toks[i].low != "one" for i in words):
    return Answer("ambiguous", text=s, reason="several numbers")  # "18 (eighteen)", "18, nineteen"
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


def too_costly(text: str) -> bool:
  """A closed form too big to evaluate: a nested exponent ("9^{9^{9}}"), an exponent over 10,000 ("9^{99999999}",
  "1e999999999") or a factorial of over 1,000. Such an answer is not sent to math-verify (unless the gold has one)."""
  for m in _CARET_RE.finditer(text):
    j = m.end()
    if text.startswith("{", j):
      depth = 0
      for k in range(j, len(text)):  # `text` is an answer span: bounded
        depth += {"{": 1, "}": -1}.get(text[k], 0)
        if depth == 0:
          break
      if "^" in text[j:k]:
        return True
    elif _UNBRACED_TOWER_RE.match(text, j):
      return True
  if any(int(m.group(1) or m.group(2)) > 10_000 for m in _EXPONENT_RE.finditer(text)):
    return True
  return any(int(m.group(1)) > 1000 for m in _FACTORIAL_RE.finditer(text))


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
        out.append(_Span(text[cs:ce], _lead(text, start), text[ce + 1 : min(le, ce + 1 + _WINDOW)], le))
  elif marker in ("hashes", "answer_colon"):
    for m in (_HASHES_RE if marker == "hashes" else _ANSWER_COLON_RE).finditer(text):
      if m.group(1).strip():
        out.append(_Span(m.group(1), _lead(text, m.start()), "", m.end()))
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
        out.append(_Span(span, _lead(text, m.start()), tail, le))
      if len(out) >= cap:
        break
  else:
    raise ValueError(f"unknown answer marker {marker!r}; known: {MARKERS}")
  return out


def _walk_lead(lead: str) -> str:
  """A signal in the words that lead into a box or "####" ("is not", "cannot be", "not equal to", "at least")."""
  toks = _tokens(lead)
  for i, t in reversed(list(enumerate(toks))):
    if t.kind == "sym" and t.text in _BOUNDARY:
      return ""
    cat = _signal(toks, i, near=True, before_number=True)
    if cat:
      return f"{cat}: {t.text}"
    if not (t.kind == "word" and t.low in _LINK or t.kind == "sym" and t.text in _LINK_SYMS or t.text in _LINK_CMDS):
      return ""
  return ""


def _clause_lead(lead: str) -> str:
  """A negation, hedge or condition in the clause before "the answer is" ("Maybe", "I don't think", "If")."""
  toks = _tokens(lead)
  start = max((i + 1 for i, t in enumerate(toks) if t.text in _BOUNDARY or t.low in _CLAUSE_WORDS), default=0)
  for i, t in enumerate(toks[start:], start):
    cat = _signal(toks, i, near=False, before_number=False)
    if cat in ("negation", "hedge") or t.low in _CONDITIONAL:
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


def _tail_refusal(tail: str, answer: Answer) -> str:
  """A signal on the rest of the answer's line, a clause there that starts a correction ("but", "wait") or with
  another number, or another number after an alternative word ("it could also be 19")."""
  toks = _tokens(tail)
  clause_start, alternative = True, False
  for i, t in enumerate(toks):
    cat = _signal(toks, i, near=False, before_number=False) or ("correction" if t.low in _CORRECTION else "")
    if cat:
      return f"{cat}: {t.text}"
    if clause_start and t.low in _RESTART:
      return f"correction: {t.text}"
    if (clause_start or alternative) and _other_number(toks, i, answer):
      return "several numbers"
    alternative = alternative or t.low in _ALTERNATIVE
    if t.text in _BOUNDARY:
      clause_start = True
    elif not (t.kind == "sym" and t.text in ("(", "[", "{", "$", "=", ":", "-", "+", "*")):
      clause_start = False
  return ""


def _next_line_refusal(text: str, pos: int, answer: Answer) -> str:
  """The next non-empty line starts a correction or an alternative ("Or 19", "Wait", "No"), or is another number."""
  start = len(text) - len(text[pos:].lstrip())
  toks = _tokens(text[start : start + _WINDOW])
  body = [t for t in toks if t.kind != "sym" or t.text in _SIGNAL_SYMS or t.text in _BOUNDARY or t.text == ":"]
  while body and body[0].kind == "sym" and body[0].text not in _SIGNAL_SYMS:
    body.pop(0)  # markdown bullets and quotes aside
  if not body:
    return ""
  if body[0].kind == "word" and body[0].low in _RESTART:
    return f"correction: {body[0].text}"
  lone = len(body) <= 4
  cut = next((j for j, t in enumerate(body) if j and t.text in (".", "?", "!", ":", ";")), len(body))
  body = body[: min(cut, 8)]  # its first sentence: "That is wrong.", "I'm not sure." ("Question: Maybe 5?" is no hedge)
  judged = next((t for t in body if t.kind == "word" and t.low in _JUDGMENT), None)
  if judged is not None:
    return f"negation: {judged.text}"
  for j, t in enumerate(body):  # "I'm not sure.", "Probably."
    after = body[j + 1].low if j + 1 < len(body) else ""
    if t.low in _HEDGE - {"or", "either", "ish"} or (t.low in _NEGATION and after in _DOUBT):
      return f"hedge: {t.text}"
  if lone and _other_number(body, 0, answer):
    return "several numbers"
  return ""


def extract_answer(completion: str, config: MathsConfig = MathsConfig()) -> Extraction:
  """The final answer of a completion and its interpretation, or why there is none (see the module docstring)."""
  if len(completion) > config.max_chars:
    return Extraction(None, "none", "too_long")
  text = completion.translate(_UNICODE)
  for marker in config.markers:
    spans = _spans(text, marker, config)
    if not spans:
      continue
    if len(spans) > config.max_answers:
      return Extraction(None, marker, "too_many")
    found = []
    for span in spans:
      if len(span.text) > config.max_answer_chars:
        return Extraction(None, marker, "too_long")
      a = interpret(span.text, config.max_answer_chars)
      if a.kind in ("refused", "ambiguous", "too_long"):
        return Extraction(None, marker, a.reason or a.kind)
      if a.kind != "empty":  # a heading "#### Final Answer", an empty box: not an answer
        found.append((span, a))
    for k, (span, a) in enumerate(found):
      lead = _clause_lead(span.lead) if marker == "answer_is" else _walk_lead(span.lead)
      why = (
        (lead and f"{lead} (before the answer)")
        or _tail_refusal(span.tail, a)
        or (k == len(found) - 1 and _next_line_refusal(text, span.line_end, a))
      )
      if why:
        return Extraction(None, marker, why)
    if not found:
      continue
    keys = {(a.kind, a.value, a.percent) if a.kind == "number" else (a.kind, a.text) for _, a in found}
    if len(keys) > 1:
      return Extraction(None, marker, "conflicting")
    return Extraction(found[-1][0].text.strip(), marker, answer=found[-1][1])
  if config.last_number_fallback:
    toks = _tokens(text)
    k = max((i for i, t in enumerate(toks) if t.kind == "num"), default=None)
    if k is not None:
      glued_minus = k and toks[k - 1].text == "-" and toks[k - 1].end == toks[k].start
      number = ("-" if glued_minus else "") + toks[k].text
      return Extraction(number, "last_number", answer=interpret(number))
  return Extraction(None, "none", "no_answer")
