"""Maths answer text: Unicode folding (every numeral a number, no value dropped) and where a marker is an aside."""

from __future__ import annotations

import pytest

from rl_lm.rewards.answer_text import aside, fences, normalise
from rl_lm.rewards.answer_words import is_unspaced, unspaced_signal


@pytest.mark.parametrize(
  ("text", "folded"),
  [
    ("#### 18", "#### 18"),  # ASCII: unchanged
    ("18²", "18^{2}"),  # an exponent, never dropped
    ("x²³", "x^{23}"),
    ("x₁₀", "x_{10}"),
    ("１８", "18"),  # digits of any script are ASCII digits
    ("١٨", "18"),
    ("१८", "18"),
    ("½", " 1/2 "),  # other numerals stand alone: "18½" is two numbers
    ("⅓", " 1/3 "),
    ("⑱", " 18 "),
    ("Ⅻ", " 12 "),
    ("十八", " 10  8 "),
    ("两", " 2 "),
    ("n\u200bot", "not"),  # invisible characters are removed
    ("ｎｏｔ", "not"),  # compatibility forms are ASCII
    ("𝐧𝐨𝐭", "not"),
    ("18º", "18°"),
    ("答案。不对", "答案. 不对"),
    ("−5 × 2", "-5 * 2"),
    ("“18”", '"18"'),
  ],
)
def test_normalise_folds_numerals_and_keeps_values(text, folded):
  assert normalise(text) == folded
  assert normalise(folded) == folded  # idempotent


@pytest.mark.parametrize(
  ("text", "marker", "kind"),
  [
    ("#### 18", "####", ""),
    ("```\n#### 18\n```", "####", "code"),
    ("```python\nprint('#### 18')\n", "####", "code"),  # an unclosed fence runs to the end
    ("~~~\n#### 18\n~~~", "####", "code"),
    ("`#### 18` is the format", "####", "code"),
    ("it costs 5` and\n#### 18", "####", ""),  # a stray backtick on another line
    ('He wrote "#### 18" on the board.', "####", "quote"),
    ('The board is 5" wide. #### 18', "####", ""),  # an unclosed quotation mark: inches
    ("e.g. #### 18", "####", "example"),
    ("For example: \\boxed{18}", "\\boxed", "example"),
    ("For example:\n\n#### 18", "####", "example"),
    ("> #### 18", "####", "blockquote"),
    ("In the required format: #### 18", "####", "format"),
    ("Here it is in the format:\n#### 18", "####", "format"),
    ("```\ncode\n```\n#### 18", "####", ""),
  ],
)
def test_asides(text, marker, kind):
  assert aside(text, text.index(marker), fences(text), 160) == kind


def test_fences_pair_like_markers():
  text = "```\na\n~~~\nb\n```\nc\n~~~~\nd"
  assert fences(text) == [(0, text.index("\nc")), (text.index("~~~~"), len(text))]


def test_unspaced_text_is_read_by_substring():
  assert is_unspaced("答案不是") and is_unspaced("정답은") and not is_unspaced("nicht") and not is_unspaced("не")
  assert unspaced_signal("答案不是") == ("negation", "不")
  assert unspaced_signal("大约") == ("hedge", "约")
  assert unspaced_signal("所以答案是") is None
