"""Maths verifier against a hostile policy: negated, hedged, comparative and multi-answer phrasings of the gold
score 0; fair phrasings score 1; pathological completions cost little CPU time and never reach math-verify."""

from __future__ import annotations

import itertools
import time

import pytest

from rl_lm.rewards.maths import MathsConfig, SymbolicPool, verify_answer

# {x}: the gold in some format; {y}: another number.
NEGATED = (
  "The answer is not {x}.", "The answer is NOT {x}.", "The answer is definitely not {x}.",
  "The final answer is never {x}.", "#### not {x}", "#### Not {x}", "#### {x} is wrong", "#### {x} is incorrect",
  "#### {x} (wrong)", "#### {x} is false", "#### {x} is not the answer", "#### {x} isn't right", "#### isn't {x}",
  "#### no, not {x}", "#### never {x}", "#### anything but {x}", "#### anything except {x}", "#### ≠ {x}",
  "#### != {x}", "Answer: not {x}", "Answer: {x} is incorrect", "\\boxed{{{x}}} is wrong",
  "\\boxed{{{x}}} is incorrect.", "\\boxed{{{x}}} is not correct", "\\boxed{{\\neq {x}}}", "\\boxed{{x \\neq {x}}}",
  "\\boxed{{x \\ne {x}}}", "$x \\neq \\boxed{{{x}}}$", "\\boxed{{\\text{{not }} {x}}}",
  "The answer cannot be \\boxed{{{x}}}.", "It is not \\boxed{{{x}}}.", "The result is not equal to \\boxed{{{x}}}",
  "I don't think the answer is {x}.", "It's not true that the answer is {x}.", "The answer is {x}. That is wrong.",
  "The answer is {x}, which is incorrect.", "#### {x}\nThat is wrong.", "#### {x}\nNo, that's not it.",
  "\\boxed{{{x}}}\nBut that is incorrect.",
)
HEDGED = (
  "#### maybe {x}", "#### perhaps {x}", "#### probably {x}", "#### possibly {x}", "#### approximately {x}",
  "#### approx. {x}", "#### about {x}", "#### around {x}", "#### roughly {x}", "#### nearly {x}", "#### almost {x}",
  "#### ~{x}", "#### ~ {x}", "#### ≈{x}", "#### ≈ {x}", "#### {x}ish", "#### {x}-ish", "#### {x}?", "#### {x} or so",
  "#### {x} (approximately)", "#### {x} (roughly)", "#### {x} +/- 1", "#### {x} ± 1", "#### {x} +- 1",
  "#### {x} give or take", "#### I guess {x}", "#### {x}, I think", "#### {x} probably", "\\boxed{{\\approx {x}}}",
  "\\boxed{{\\sim {x}}}", "\\boxed{{{x} \\pm 1}}", "\\boxed{{{x}?}}", "The answer is probably {x}.",
  "The answer is about {x}.", "Maybe the answer is {x}.", "Perhaps the answer is {x}.", "I guess the answer is {x}.",
  "The answer is approximately \\boxed{{{x}}}.", "The answer is roughly $\\boxed{{{x}}}$",
  "Answer: approximately {x}", "Answer: {x}?", "\\boxed{{{x}}}?", "\\boxed{{{x}}}, probably",
)
SEVERAL = (
  "#### {x} or {y}", "#### {y} or {x}", "#### {x}, {y}", "#### {x} and/or {y}", "#### either {x} or {y}",
  "#### {x} (or {y})", "#### {x} (not {y})", "#### {x}? No, {y}", "#### {x} {y}", "#### {x}; {y}", "#### {x} and {y}",
  "The answer is {x}. Or {y}.", "The answer is {x}! Or {y}.", "The answer is {x}. Maybe {y}.",
  "The answer is {x}, or maybe {y}.", "The answer is {x}.\nOr {y}.", "The answer is {x}. Actually, {y}.",
  "The answer is {x}. Wait, {y}.", "The answer is {x}. But it could also be {y}.",
  "The answer is {x}; it could also be {y}.", "The answer is {x}. {y}.", "The answer is {x} (or {y}).",
  "#### {x}\nor {y}", "#### {x}\nActually {y}", "#### {x}\n{y}", "\\boxed{{{x}}} or \\boxed{{{y}}}",
  "\\boxed{{{y}}} or \\boxed{{{x}}}", "\\boxed{{{x}}} or {y}", "\\boxed{{{x}}}, {y}", "\\boxed{{{x}}} (or {y})",
  "\\boxed{{{x} \\text{{ or }} {y}}}", "\\boxed{{{x}, {y}}}", "\\boxed{{\\{{{x}, {y}\\}}}}",
  "\\boxed{{{x}}}. Or maybe \\boxed{{{y}}}.", "\\boxed{{{x}}}\nWait, \\boxed{{{y}}}", "Answer: {x} or {y}",
  "A: {x}\nA: {y}", "#### {x}\n#### {y}", "#### {y}\n#### {x}", "\\boxed{{{x}}} and \\boxed{{{y}}}",
)
COMPARED = (
  "#### less than {x}", "#### more than {x}", "#### fewer than {x}", "#### greater than {x}", "#### at least {x}",
  "#### at most {x}", "#### At most {x}", "#### {x} or more", "#### {x} or fewer", "#### {x} or less",
  "#### {x} at most", "#### {x} at least", "#### {x}+", "#### {x} max", "#### {x} maximum", "#### {x} minimum",
  "#### up to {x}", "#### no more than {x}", "#### not less than {x}", "#### over {x}", "#### under {x}",
  "#### above {x}", "#### below {x}", "#### within {x}", "#### {x} and up", "#### {x} and above", "#### < {x}",
  "#### > {x}", "#### <= {x}", "#### >= {x}", "#### ≤ {x}", "#### ≥ {x}", "#### between {y} and {x}",
  "#### {x} to {y}", "#### from {x} to {y}", "\\boxed{{x < {x}}}", "\\boxed{{\\le {x}}}", "\\boxed{{\\geq {x}}}",
  "\\boxed{{x \\leq {x}}}", "The answer is less than {x}.", "The answer is at least \\boxed{{{x}}}.",
  "The answer is more than {x}.", "The answer is {x} or more.", "It is at most \\boxed{{{x}}}",
  "$x \\geq \\boxed{{{x}}}$", "Answer: at least {x}",
)
FOREIGN = (  # negations, hedges and bounds in the common languages of maths data
  "#### nicht {x}", "#### kein {x}", "#### etwa {x}", "#### vielleicht {x}", "#### {x} oder {y}", "#### mindestens {x}",
  "#### pas {x}", "#### environ {x}", "#### peut-être {x}", "#### au moins {x}", "#### no {x}", "#### quizás {x}",
  "#### aproximadamente {x}", "#### tal vez {x}", "#### al menos {x}", "#### não {x}", "#### nao {x}",
  "#### talvez {x}", "#### pelo menos {x}", "#### non {x}", "#### forse {x}", "#### almeno {x}", "#### не {x}",
  "#### около {x}", "#### примерно {x}", "#### {x} или {y}", "#### не менее {x}", "#### 不是{x}", "#### 大约{x}",
  "#### {x}左右", "#### 至少{x}", "#### {x}或{y}", "#### {x}ではない", "#### 約{x}", "#### {x}以上", "#### {x} değil",
  "#### yaklaşık {x}", "#### en az {x}", "#### không {x}", "#### khoảng {x}", "#### ít nhất {x}", "#### नहीं {x}",
  "#### लगभग {x}", "#### ليس {x}", "#### حوالي {x}", "#### {x} 아니다", "#### 약 {x}", "#### tidak {x}",
  "Die Antwort ist nicht \\boxed{{{x}}}.", "La respuesta no es \\boxed{{{x}}}.", "La réponse n'est pas \\boxed{{{x}}}.",
  "La risposta non è \\boxed{{{x}}}.", "A resposta não é \\boxed{{{x}}}.", "Ответ не \\boxed{{{x}}}.",
  "答案不是\\boxed{{{x}}}", "答案大约是\\boxed{{{x}}}", "Возможно, ответ \\boxed{{{x}}}", "정답은 약 \\boxed{{{x}}}",
  "\\boxed{{{x}}} ist falsch.", "\\boxed{{{x}}} es incorrecto.", "\\boxed{{{x}}}ではありません",
  "Cevap \\boxed{{{x}}} değil.",
  "उत्तर \\boxed{{{x}}} नहीं है", "\\boxed{{{x}}}。不对", "#### {x}\n不对，是{y}", "#### {x}\nNein, {y}",
  "#### {x}\nEn realidad, {y}", "It is nоt \\boxed{{{x}}}", "It is ｎｏｔ \\boxed{{{x}}}",
  "It is n\u200bot \\boxed{{{x}}}",
  "#### {x} 个", "#### {x} años",
)
UNICODE_VALUES = (  # numerals that are numbers, or change the value
  "#### {x}²", "#### {x}³", "\\boxed{{{x}⁴}}", "#### {x}½", "#### {x} ¾", "#### {x} ⑲", "#### ⑲ {x}", "#### {x} Ⅻ",
  "#### {x} 十九", "#### 十九 {x}", "#### {x} １９", "#### {x} ١٩", "#### {x} १९", "#### {x}₁₉", "#### {x} ½",
)
JOINED = (  # two values joined by a LaTeX relation or separator
  "\\boxed{{{x} \\mid {y}}}", "\\boxed{{{y} \\mid {x}}}", "\\boxed{{x = {y} = {x}}}", "\\boxed{{x = {x} = {y}}}",
  "\\boxed{{{y} \\to {x}}}", "\\boxed{{{y} \\rightarrow {x}}}", "\\boxed{{{y} \\Rightarrow {x}}}",
  "\\boxed{{{y} \\implies {x}}}", "\\boxed{{{y} \\iff {x}}}", "\\boxed{{{y} \\mapsto {x}}}",
  "\\boxed{{{y} \\gets {x}}}",
  "\\boxed{{{y} \\equiv {x}}}", "\\boxed{{{y} \\ne {x}}}", "\\boxed{{{y}; {x}}}", "\\boxed{{{y} \\quad {x}}}",
  "\\boxed{{{y} \\qquad {x}}}", "\\boxed{{{y} \\\\\\\\ {x}}}", "\\boxed{{{y} & {x}}}",
  "\\boxed{{{y} \\text{{ or }} {x}}}",
  "\\boxed{{{y} \\lor {x}}}", "\\boxed{{{y} \\vee {x}}}", "\\boxed{{{y} \\cup {x}}}", "\\boxed{{{y} \\land {x}}}",
  "\\boxed{{{y} \\colon {x}}}", "\\boxed{{{y} \\ldots {x}}}", "\\boxed{{{y}, {x}}}",
  "\\boxed{{x = {y} \\quad x = {x}}}",
  "\\boxed{{{y} → {x}}}", "\\boxed{{{y} \\hspace{{1em}} {x}}}", "\\boxed{{{y} \\text{{ and }} {x}}}",
  "$ {y} \\mid \\boxed{{{x}}}$",
)
RETRACTED = (  # a retraction on the answer's line, without another number
  "#### {x} (jk)", "#### {x} jk", "#### {x} j/k", "#### {x} /s", "#### {x} /j", "#### {x} lol", "#### {x} lol no",
  "#### {x} not really", "#### {x} (kidding)", "#### {x} (just kidding)", "#### {x} 😜", "#### {x} 🙃",
  "#### {x} (typo)",
  "#### {x} sike", "#### {x} lmao", "#### {x} (wait)", "#### {x} scratch that", "#### {x} nvm", "#### {x} (sarcasm)",
  "\\boxed{{{x}}} /s", "\\boxed{{{x}}} (jk)", "\\boxed{{{x}}} 🙃", "\\boxed{{{x}}} 🤷", "\\boxed{{{x}}} lol no",
  "\\boxed{{{x}}} ❌", "\\boxed{{{x}}} j/k", "The answer is {x} (jk).", "The answer is {x}. Just kidding.",
  "The answer is {x}. Not really.", "The answer is {x}. lol", "Answer: {x} lmao", "Answer: {x} /s", "#### {x}\nlol no",
  "#### {x}\nj/k", "#### {x}\n/s", "#### {x}\n😜", "#### {x}\nNot really.", "\\boxed{{{x}}}\nJust kidding.",
)
CORRECTED = (  # another number after the answer, on its line or the next ones, in any wording
  "#### {x}\nGreat!\nUpdate: {y}", "#### {x}\nQuestion: Is the answer {y} instead?", "#### {x}\n\nDone.\n\nIt is {y}.",
  "#### {x}\nUpdate: {y}", "#### {x}\nEdit: {y}", "#### {x}\nUPDATE: {y}", "#### {x}\n\nP.S. it is {y}",
  "#### {x}\nTypo: {y}", "#### {x}\nI meant {y}", "#### {x}\n{y} actually", "#### {x}\nCorrection: {y}",
  "#### {x}\nThe real total is {y}.", "#### {x}\nTotal = {y}", "#### {x}\nRevised: {y}", "#### {x}\n**Edit:** {y}",
  "#### {x}\n- {y}", "#### {x}\n({y})", "#### {x}\n\n\n{y}", "#### {x}\nIt is {y} dollars.", "#### {x}\n\\boxed{{{y}}}",
  "#### {x}\n\nThe answer is {y}.", "#### {x}\nThe answer is not {x}.", "#### {x}\nErratum: the answer is {y}.",
  "\\boxed{{{x}}}\nUpdate: \\boxed{{{y}}}",
  "\\boxed{{{x}}}\n\nFinal Answer: The final answer is {y}. I hope it is correct.",
  "\\boxed{{{x}}} update {y}", "\\boxed{{{x}}} → {y}", "\\boxed{{{x}}} 😜 {y}", "\\boxed{{{x}}} (jk, {y})",
  "\\boxed{{{x}}} nvm, {y}", "\\boxed{{{x}}} — {y}", "The answer is {x}. Update: {y}.",
  "The answer is {x}; scratch that, {y}.",
  "The answer is {x}. The real answer is {y}.", "The answer is {x} because update {y}.",
  "#### {x}\n\nSome words in between.\n\nThe answer is {y}.", "\\boxed{{{x}}}\n\nmore text\n\nAnswer: {y}",
)
ASIDES = (  # a marker in a quotation, code or an example, then another final answer; or an example alone
  "```\n#### {x}\n```\nThe answer is {y}.", "~~~\n\\boxed{{{x}}}\n~~~\nAnswer: {y}", "`#### {x}`\n#### {y}",
  "Example: #### {x}\n\nSo the answer is {y}.", "e.g. #### {x}\n#### {y}", "> #### {x}\nThe answer is {y}.",
  "He wrote \"#### {x}\" on the board.\n#### {y}", "For example:\n#### {x}\nNow the real one: \\boxed{{{y}}}",
  "Write it like this, for example \\boxed{{{x}}}.\n\\boxed{{{y}}}", "> The answer is {x}.\n\\boxed{{{y}}}",
  "e.g. #### {x}", "For example:\n#### {x}", "```\n#### {x}\n```", "`#### {x}`", "Such as \\boxed{{{x}}}.",
  "```python\nprint(\"#### {x}\")\n", "An example answer: \"The answer is {x}.\"",
)
#: gold, formats of the gold, another number
GOLDS = (
  ("18", ("18", "18.0", "$18", "18 dollars"), "19"),
  ("1600", ("1600", "1,600", "$1,600.00"), "1700"),
  ("7", ("7", "7.00", "7 eggs"), "8"),
  ("0.5", ("0.5", "1/2", ".5"), "0.75"),
  ("-3", ("-3", "-3.0"), "-2"),
)
FAIR = (
  "#### {x}", "#### {x}\n", "#### **{x}**", "#### x = {x}", "The answer is {x}.", "The answer is: {x}",
  "The final answer is {x}. I hope it is correct.",
  "The answer is {x}.\nHere is why: 16 - 3 - 4 = 9, not 10, and no more.",
  "The answer is {x}. That is what she earns.", "\\boxed{{{x}}}", "$\\boxed{{{x}}}$", "\\boxed{{\\boxed{{{x}}}}}",
  "\\boxed{{\\text{{{x}}}}}", "Therefore, she makes $\\boxed{{{x}}}$ every day.", "So the final answer is \\({x}\\).",
  "Answer: {x}", "**Answer:** {x}", "Final answer: {x}", "\\[\n\\boxed{{{x}}}\n\\]",
  "The number of eggs she does not eat is \\boxed{{{x}}}.", "She doesn't sell 3 eggs, so the answer is {x}.",
  "La respuesta es \\boxed{{{x}}}.", "La réponse est \\boxed{{{x}}}.", "Die Antwort ist \\boxed{{{x}}}.",
  "所以答案是\\boxed{{{x}}}", "答えは\\boxed{{{x}}}です", "> Answer: {x}", "In the required format:\n#### {x}",
  "#### {x}\n<|endoftext|>Question: What is 2 + 3?",
  "#### {x}\n\nQuestion: Tom has 5 apples and eats 2. How many are left?",
  "\\boxed{{{x}}}\n\nFinal Answer: The final answer is {x}. I hope it is correct.",
  "The answer is {x}.\nThat is {x} in all.",
  "Here is code:\n```python\nprint('#### 5')\n```\n#### {x}", "#### {x}\n✅", "\\boxed{{{x}}} 🎉",
  "e.g. #### 5 is the format.\n#### {x}", "The answer is {x} because 16 - 3 - 4 = 9 and 9 * 2 = 18.",
)


def _cases(templates: tuple[str, ...]) -> list[tuple[str, str]]:
  return [
    (gold, t.format(x=x, y=y)) for t, (gold, formats, y) in itertools.product(templates, GOLDS) for x in formats
    if not (x.startswith("$") and "\\boxed" in t)  # "$" closes a LaTeX "$...$" there
    and not (" " in x and "{x}ish" in t)  # "18 dollarsish" is no word
    and not (x.startswith("$") and t.startswith("$"))  # "$$18": a display-math delimiter
  ]


@pytest.fixture(scope="module")
def pool():
  p = SymbolicPool(workers=1, timeout_s=10.0)
  yield p
  p.close()


@pytest.mark.parametrize(
  ("kind", "templates"),
  [
    ("negated", NEGATED), ("hedged", HEDGED), ("several", SEVERAL), ("compared", COMPARED), ("foreign", FOREIGN),
    ("unicode", UNICODE_VALUES), ("joined", JOINED), ("retracted", RETRACTED), ("corrected", CORRECTED),
    ("asides", ASIDES),
  ],
)
def test_unfair_phrasings_of_the_gold_score_zero(kind, templates, pool):
  cases = _cases(templates)
  assert len(cases) >= 60
  rewarded = []
  for gold, completion in cases:
    r = verify_answer(gold, completion, pool=pool)
    if r.score != 0.0 or not r.valid:
      rewarded.append((gold, completion, r.status, dict(r.info)))
  assert not rewarded, f"{len(rewarded)}/{len(cases)} {kind} phrasings rewarded or masked: {rewarded[:10]}"


def test_fair_phrasings_of_the_gold_score_one(pool):
  cases = _cases(FAIR)
  failed = [(g, c, dict(r.info)) for g, c in cases if (r := verify_answer(g, c, pool=pool)).score != 1.0]
  assert not failed, f"{len(failed)}/{len(cases)}: {failed[:10]}"


@pytest.mark.parametrize(
  ("gold", "completion"),
  [
    ("1/3", "#### 0.\\overline{3}"), ("1/3", "\\boxed{0.\\bar{3}}"), ("1/3", "#### 0.(3)"),
    ("1/3", "\\boxed{\\frac{1}{3}}"), ("1/6", "#### 0.1\\overline{6}"), ("1/7", "\\boxed{0.\\overline{142857}}"),
    ("4/3", "#### 1.\\overline{3}"), ("1", "#### 0.\\overline{9}"), ("0.5", "\\boxed{\\dfrac{1}{2}}"),
    ("18", "#### 36/2"), ("18", "\\boxed{\\frac{36}{2}}"), ("18", "\\boxed{18 \\text{ dollars}}"),
    ("18", "\\boxed{\\$18}"), ("18", "#### €18"), ("18", "#### 18°"), ("18", "#### 18th"), ("18", "#### 018"),
    ("18", "#### +18"), ("18", "#### 1.8e1"), ("18", "#### eighteen"), ("21", "#### twenty-one"), ("18", "#### 18!"),
    ("18", "#### 18 eggs per day"), ("18", "#### $18/day"), ("5", "#### 5 more apples"),
    ("5", "#### 5 fewer cats than dogs"), ("18000", "#### 18 thousand"), ("18000", "#### 18k"),
    ("24", "#### 2 dozen"), ("25", "#### 25%"), ("25", "#### 25 percent"), ("0.25", "#### 25%"),
    ("25", "\\boxed{25\\%}"), ("12.5\\%", "#### 12.5"), ("12.5\\%", "#### 12.5%"), ("12.5\\%", "#### 0.125"),
    ("18", "#### 18 (rounded up)"), ("18", "\\boxed{18} dollars over the week, more than yesterday"),
    ("18", "#### １８"), ("18", "#### ١٨"), ("18", "#### १८"), ("18", "#### ⑱"), ("12", "#### Ⅻ"), ("0.5", "#### ½"),
    ("2\\pi", "#### 2π"), ("324", "#### 18²"), ("18", "#### 18º"), ("18", "#### 18 μg"), ("18", "#### 1\u200b8"),
    ("18000", "\\boxed{18\\,000}"), ("1000", "\\boxed{1,\\!000}"), ("18", "\\boxed{18 \\quad \\text{dollars}}"),
    ("18", "9 \\times 2 = \\boxed{18}"), ("18", "$36/2 = \\boxed{18}$"), ("18", "\\boxed{x = 18}"),
    ("18", "> #### 18"), ("18", "Step 3: \\boxed{18}"), ("18", "Ответ: \\boxed{18}"), ("18", "Đáp án là \\boxed{18}"),
    ("x^{2}", "\\boxed{x²}"), ("18", "<think>So the answer is 17. Hmm, let me recheck.</think>\n\\boxed{18}"),
  ],
)
def test_fair_forms_match(gold, completion, pool):
  r = verify_answer(gold, completion, pool=pool)
  assert (r.score, r.status) == (1.0, "ok"), r.info


@pytest.mark.parametrize(
  ("gold", "completion"),
  [
    ("0.5", "#### 0.5%"), ("0.5", "#### 0.5 %"), ("0.5", "#### 0.5 percent"), ("0.5", "\\boxed{0.5\\%}"),
    ("0.5", "The answer is 0.5%."), ("0.25", "Answer: 0.25%"), ("12.5", "#### 12.5%"), ("18", "#### 18 thousand"),
    ("18", "#### 18k"), ("18", "#### -18"), ("18", "#### -(-18)"), ("18", "#### 17+1"), ("18", "#### 2 \\times 9"),
    ("18", "#### 2*9"), ("18", "#### 2**9"), ("0.333", "#### 0.\\overline{3}"), ("18", "#### 18/1/1"),
    ("18", "#### 18²"), ("2", "#### 2π"), ("2", "#### 2 pi"), ("10", "#### gamma(10)"), ("1819", "\\boxed{18\\,19}"),
    ("37", "\\boxed{18\\;19}"), ("18", "#### 18 m²"),
  ],
)
def test_value_changing_forms_do_not_match(gold, completion, pool):
  r = verify_answer(gold, completion, pool=pool)
  assert r.score == 0.0 and r.valid, r.info


PATHOLOGICAL = {
  "unclosed_boxes": "\\boxed{" * 8000,
  "unclosed_boxes_under_the_cap": "\\boxed{" * 7000,
  "brace_commas": "#### " + "{," * 2000,
  "brace_commas_under_the_cap": "#### " + "{," * 140,
  "brace_commas_in_a_box": "\\boxed{" + "{," * 3000 + "}",
  "long_digits": "#### " + "9" * 40000,
  "digits_with_dots": "The answer is " + "1." * 20000,
  "deep_braces": "\\boxed{" + "{" * 20000 + "18" + "}" * 19999,
  "dollars": "$" * 50000,
  "open_fracs": "\\boxed{" + "\\frac{" * 5000,
  "closed_fracs": "\\boxed{" + "\\frac{1}{" * 3000 + "2" + "}" * 3000 + "}",
  "numbers_on_one_line": "The answer is " + " ".join(str(i) for i in range(8000)),
  "answer_is_flood": "the answer is " * 3500,
  "boxes_flood": "\\boxed{17}" * 4000,
  "hashes_flood": "#### 17\n" * 6000,
  "spaces": "#### " + " " * 45000 + "17",
  "hashes_run": "#" * 49000,
  "exponent_tower": "#### " + "9^{" * 60 + "9" + "}" * 60,
  "huge_exponent": "#### 1e999999999",
  "slashes": "#### " + "1/" * 20000 + "1",
  "over_the_cap": "#### 18\n" + "x" * 60000,
  "superscripts": "#### 18" + "²" * 45000,
  "chinese_numerals": "#### " + "十" * 45000,
  "invisible": "#### 1" + "\u200b" * 45000 + "7",  # folded to 17
  "combining_marks": "#### 18" + "\u0301" * 45000,
  "fences": "```\n" * 12000,
  "quotes": '"#### 18' * 6000,
  "examples": "e.g. #### 18\n" * 4000,
  "blockquotes": "> #### 18\n" * 4000,
  "unspaced_run": "答案不是" * 12000 + "\\boxed{18}",
  "mixed_scripts": "nоt " * 12000 + "\\boxed{18}",
  "emoji": "#### 18 " + "😜" * 20000,
  "numbers_after_the_box": "\\boxed{18}" + " 19" * 15000,
  "numbers_on_the_next_line": "#### 18\n" + "19 " * 15000,
  "separators": "#### " + "18 \\mid " * 5000,
  "nested_function": "\\boxed{" + "\\Gamma(" * 40 + "2" + ")" * 40 + "}",
}


@pytest.mark.parametrize("name", list(PATHOLOGICAL))
def test_pathological_completions_are_cheap_and_never_reach_math_verify(name):
  completion = PATHOLOGICAL[name]
  wall, cpu = time.perf_counter(), time.process_time()
  r = verify_answer("18", completion, pool=_NoPool())
  cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
  assert cpu < 1.0 and wall < 5.0, (name, cpu, wall)
  assert r.score == 0.0 and r.valid and r.info.get("path") != "symbolic", (name, r)


def test_parsing_is_linear_without_the_size_caps():
  """Eight times the probe sizes, caps lifted: still well under a second (the old matcher was quadratic)."""
  huge = MathsConfig(max_chars=10**8, max_answer_chars=10**8, symbolic=False)
  for completion in (
    "\\boxed{" * 64000, "#### " + "{," * 16000, "#### " + "9" * 320000, "$" * 400000, "#### " + "²" * 320000,
    "#### " + "十" * 40000, "```\n" * 96000, "答案不是" * 64000 + "\\boxed{18}", "\\boxed{18}" + " 19" * 120000,
  ):
    cpu = time.process_time()
    verify_answer("18", completion, huge)
    assert time.process_time() - cpu < 1.0, completion[:20]


class _NoPool:
  """A symbolic pool that must not be used."""

  def compare(self, gold: str, pred: str) -> tuple[bool | None, str, str]:
    raise AssertionError(f"reached math-verify with {pred[:50]!r}")
