"""Is a closed form too costly to hand to math-verify? A structural bound on the size of every value in it.

math-verify (sympy) evaluates what it parses: "(10^{6})!" and "\\Gamma(10^{6})" take seconds of CPU, a binomial
of a million never ends, and the name of a function can be spelled many ways ("\\Gamma", "Γ", "\\operatorname{...}",
"factorial(...)"). So rather than a list of costly names, `too_costly` bounds the magnitude of every
sub-expression, from the literals up, and refuses:
* a tower: an exponent that itself holds a power ("9^{9^{9}}", "2^(2^(2^2))", "2^2^2", "2^{2²}");
* an exponent whose value may exceed `MAX_EXPONENT` ("9^{99999999}", "e^{10^9}", "\\exp(10^9)", "exp(10^9)",
  "1e999999999");
* a factorial-like postfix ("!", "!!", primorial "#") or prefix (subfactorial "!") on a value that may exceed
  `MAX_ARGUMENT` ("1000000!", "(10^{6})!", "{10^6}!!");
* any function application whose argument may exceed `MAX_ARGUMENT`, whatever the function: a command or a
  word followed by its arguments ("\\Gamma(10^{6})", "\\Gamma(1e6)", "\\binom{10^{6}}{500000}",
  "\\operatorname{factorial}(10^6)", "binomial(10^6, 5*10^5)", "fibonacci(10^9)", "sf(10^4)", "\\prod_{i=1}^{10^6}"),
  except the functions that stay cheap for any argument (roots, logarithms, trigonometry, floor, absolute value,
  fractions, formatting; `_CHEAP`);
* a value that may have more than `MAX_DIGITS` digits ("(10^{9999})^{9999}").

The bound is an over-estimate (log10 of the magnitude): a sum or product is bounded by the product of its terms,
a quotient by the product of numerator and denominator, an unknown function of n by n^n, a factorial of n by n^n.
So it errs towards refusing; a fair GSM8K answer is one number, far below every limit. The parse is one pass over
the tokens (groups by recursion, at most `_MAX_DEPTH` deep, deeper is refused).
"""
from __future__ import annotations

import math
import re
from typing import NamedTuple

from rl_lm.rewards.answer_text import normalise

MAX_EXPONENT = 10_000  # a power's exponent, and exp's argument
MAX_ARGUMENT = 1_000  # a factorial's or any other function's argument
MAX_DIGITS = 100_000  # of any value
_MAX_DEPTH = 100

_TOKEN_RE = re.compile(
  r"(?P<num>[0-9]++(?:\.[0-9]*+)?+(?:[eE][+-]?+[0-9]++)?+|\.[0-9]++(?:[eE][+-]?+[0-9]++)?+)"
  r"|(?P<name>\\(?:operatorname\*?+|mathrm|text|textrm|mathop|mathit|textit|mbox)\s*+\{[^{}]*+\})"
  r"|(?P<cmd>\\(?:[A-Za-z]++|.))|(?P<word>[^\W\d_]++)|(?P<open>[{(\[])|(?P<close>[})\]])|(?P<sym>\S)",
  re.S,
)
_OPEN = frozenset(["\\{", "\\lbrace", "\\langle", "\\lfloor", "\\lceil"])
_CLOSE = frozenset(["\\}", "\\rbrace", "\\rangle", "\\rfloor", "\\rceil"])
_SKIP = frozenset(  # layout: no value
  "left right big Big bigg Bigg bigl bigr Bigl Bigr displaystyle textstyle quad qquad , ; : ! limits nolimits "
  "mathbf mathit mathrm mathsf boldsymbol text textbf boxed fbox".split()
)
_CHEAP = frozenset(  # the same size as (or smaller than) their arguments, for any argument
  "sqrt frac dfrac tfrac cfrac log ln lg sin cos tan cot sec csc arcsin arccos arctan tanh abs floor ceil "
  "min max gcd lcm overline bar hat vec dot tilde underline mod bmod pmod deg arg det".split()
)
_CONSTANTS = frozenset(
  "pi infty e i alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi rho "
  "sigma tau upsilon phi varphi chi psi omega".split()
)
_EXP = frozenset(["exp", "sinh", "cosh"])  # e to the argument: bounded like a power's exponent
_FACTORIAL_SYMS = frozenset(["!", "#"])


class _Costly(Exception):
  pass


class _Tok(NamedTuple):
  kind: str
  text: str


class _Size(NamedTuple):
  log: float  # upper bound of log10 |value| (0 for a variable, an operator, a value under 10)
  power: bool  # holds a power


def _name(t: _Tok) -> str:
  """The function name of a command or a word: "\\Gamma" -> "Gamma", "\\operatorname{sf}" -> "sf"."""
  if t.kind == "name":
    return t.text[t.text.index("{") + 1 : -1].strip().lower()
  return t.text[1:] if t.kind == "cmd" else t.text.lower()  # \gamma is a variable, \Gamma a function


def _number(text: str) -> float:
  mantissa, _, exp = text.lower().partition("e")
  whole = mantissa.split(".")[0].lstrip("0")
  if exp and (len(exp) > 6 or abs(int(exp)) > MAX_EXPONENT):
    raise _Costly
  digits = len(whole) - 1 + math.log10(int(whole[:15])) - (len(whole[:15]) - 1) if whole else 0.0
  return abs(digits + (int(exp) if exp else 0))


def _value(log: float) -> float:
  return math.inf if log > 300 else 10.0**log


class _Parser:
  def __init__(self, text: str) -> None:
    self.toks = [_Tok(m.lastgroup or "sym", m.group()) for m in _TOKEN_RE.finditer(text)]
    self.i = 0

  def peek(self) -> _Tok | None:
    return self.toks[self.i] if self.i < len(self.toks) else None

  def is_open(self, t: _Tok | None) -> bool:
    return t is not None and (t.kind == "open" or t.text in _OPEN)

  def next_is(self, text: str) -> bool:
    return self.i < len(self.toks) and self.toks[self.i].text == text

  def skip_layout(self) -> bool:
    """Moves past "\\left", "\\big" and the like; always True."""
    while self.i < len(self.toks) and self.toks[self.i].kind == "cmd" and self.toks[self.i].text[1:] in _SKIP:
      self.i += 1
    return True

  def operand(self) -> bool:
    """A token follows that can start an operand (not the end, not a close)."""
    t = self.peek()
    return t is not None and not (t.kind == "close" or t.text in _CLOSE)

  def expr(self, depth: int) -> _Size:
    """Terms up to the close of the current group: their sizes add (a product bounds a sum)."""
    if depth > _MAX_DEPTH:
      raise _Costly
    log, power = 0.0, False
    while (t := self.peek()) is not None and not (t.kind == "close" or t.text in _CLOSE):
      s = self.term(depth)
      log, power = log + s.log, power or s.power
    self.i += 1  # the close
    return _Size(log, power)

  def term(self, depth: int) -> _Size:
    t = self.peek()
    if t.text in _FACTORIAL_SYMS:  # subfactorial "!n"
      self.i += 1
      return self.factorial(self.term(depth + 1)) if self.peek() is not None else _Size(0.0, False)
    size = self.atom(depth)
    while (t := self.peek()) is not None:
      if t.text == "^":
        self.i += 1
        if not self.operand():
          break
        exponent = self.atom(depth)
        if exponent.power or (self.peek() is not None and self.peek().text == "^"):
          raise _Costly  # a tower
        value = _value(exponent.log)
        if value > MAX_EXPONENT:
          raise _Costly
        size = _Size(self.bounded(max(size.log, 0.31) * value), True)
      elif t.text in _FACTORIAL_SYMS:
        self.i += 1
        size = self.factorial(size)
      elif t.text == "_":  # an index or a lower limit: no value of its own
        self.i += 1
        if self.operand():
          self.atom(depth)
      else:
        break
    return size

  def atom(self, depth: int) -> _Size:
    t = self.peek()
    self.i += 1
    if t.kind == "num":
      return _Size(_number(t.text), False)
    if self.is_open(t):
      return self.expr(depth + 1)
    if t.kind in ("cmd", "name", "word"):
      name = _name(t)
      if t.kind == "cmd" and name in _SKIP:
        return _Size(0.0, False)
      self.skip_layout()
      if (t.kind == "word" or t.kind == "cmd" and name in _CONSTANTS) and not self.next_is("("):
        return _Size(0.5, False)  # a variable, a unit or a constant
      args = self.arguments(depth, word=t.kind == "word")
      if not args:
        return _Size(0.5, False)  # a symbol: \Gamma alone
      largest = max(a.log for a in args)
      power = any(a.power for a in args)
      if name in _EXP:
        value = _value(largest)
        if value > MAX_EXPONENT:
          raise _Costly
        return _Size(self.bounded(value * 0.4343), True)
      if name in _CHEAP:
        return _Size(sum(a.log for a in args), power)
      return self.factorial(_Size(largest, power))  # any other function: bounded like a factorial
    if t.text == "√" and self.operand():
      return self.atom(depth + 1)
    return _Size(0.0, False)  # an operator or a sign

  def arguments(self, depth: int, word: bool) -> list[_Size]:
    """The groups right after a function name, its limits ("_{...}", "^{...}"), or else the next term."""
    args = []
    while self.skip_layout() and (t := self.peek()) is not None:
      if self.is_open(t) and (not word or t.text == "(" or args):
        self.i += 1
        args.append(self.expr(depth + 1))
      elif t.text in ("_", "^") and not word:
        self.i += 1
        if self.operand():
          args.append(self.atom(depth + 1))
      else:
        break
    if not args and not word and (t := self.peek()) is not None and (t.kind in ("num", "cmd", "word", "name")):
      args.append(self.term(depth + 1))
    return args

  def factorial(self, size: _Size) -> _Size:
    n = _value(size.log)
    if n > MAX_ARGUMENT:
      raise _Costly
    return _Size(self.bounded(n * math.log10(max(n, 2.0))), size.power)

  @staticmethod
  def bounded(log: float) -> float:
    if log > MAX_DIGITS:
      raise _Costly
    return log


def too_costly(text: str) -> bool:
  """The closed form may be too costly to evaluate (see the module docstring); linear in the text."""
  parser = _Parser(normalise(text))  # "2^{2²}" is a tower
  try:
    while parser.peek() is not None:
      parser.expr(0)  # a stray close ends one run of terms; the next starts after it
    return False
  except _Costly:
    return True
  except RecursionError:
    return True
