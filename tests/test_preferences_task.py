"""Synthetic preference task: hand-computed gold, the trade-off, Bradley–Terry labels, splits, JSONL loading."""

from __future__ import annotations

import itertools
import json
import math
import statistics

import pytest

from rl_lm.rewards import build_reward, make_reward
from rl_lm.tasks import make_task
from rl_lm.tasks.base import Problem
from rl_lm.tasks.preferences import (
  SyntheticPreferences,
  gold_score,
  gold_terms,
  load_pairs_jsonl,
  optimal_completion,
  split_of,
)
from rl_lm.tokenizer import CharTokenizer


@pytest.mark.parametrize("completion, expected", [
  ("", 0.0),
  ("abdb", 4 / 8),  # all on topic, no repeats, short
  ("xyz", 0.0),  # off topic: no relevance, no penalty
  ("aaaa", (4 - 1.5 * 3) / 8),  # a run: every repeat costs more than the letter earns
  ("abdabdab", 1.0),  # the optimum: 8 topic letters, no neighbour equal
  ("abdabdabda", (10 - 1.5 * 2) / 8),  # 2 past the target length
  ("axxb", (2 - 1.5) / 8),  # off-topic letters also pay for repeating
  ("a a", 2 / 8),  # spaces are ordinary characters
  ("ABD", 0.0),  # topic letters are lowercase
])
def test_gold_score_by_hand(completion, expected):
  assert gold_score("abd:", completion) == pytest.approx(expected)
  task = SyntheticPreferences()
  assert gold_score(task.make_problem("abd"), completion) == pytest.approx(expected)


def test_gold_terms_and_bad_prompt():
  # "bb" and six more "x"s repeat; 11 characters are 3 past the target
  assert gold_terms("abd:", "abbxxxxxxxa") == {"relevance": 4.0, "repeats": 7.0, "overlength": 3.0,
                                               "score": (4 - 1.5 * 7 - 1.5 * 3) / 8}
  with pytest.raises(ValueError, match="not a synthetic preference prompt"):
    gold_score("1+2=", "abc")


def test_gold_is_maximised_by_a_non_degenerate_completion():
  """Brute force over {a, b, c, z}^<=9 for topic "abc": the maximisers are exactly the 8-letter on-topic
  strings with no neighbour equal, while the cheap correlate pushed hard (runs, length) scores low."""
  best, argmax = -math.inf, []
  for n in range(10):
    for chars in itertools.product("abcz", repeat=n):
      s = "".join(chars)
      g = gold_score("abc:", s)
      if g > best:
        best, argmax = g, [s]
      elif g == best:
        argmax.append(s)
  assert best == 1.0
  assert argmax and all(len(s) == 8 and "z" not in s and all(x != y for x, y in itertools.pairwise(s)) for s in argmax)
  assert gold_score("abc:", optimal_completion("abc")) == 1.0
  assert gold_score("abc:", "a" * 16) < 0  # a long run of one topic letter: most "topic letters", low gold
  assert gold_score("abc:", "abc" * 5 + "a") == 0.5  # 16 topic letters, no repeats: too long, half the optimum
  assert gold_score("abc:", "aabbccaabbcc") < gold_score("abc:", "abcz")  # more topic letters, worse gold


def test_demonstrations_are_varied_with_a_wide_gold_spread():
  task = SyntheticPreferences(seed=0)
  problems = list(task.train_problems(1000, seed=0))
  demos = [task.reference_completion(p) for p in problems]
  golds = [gold_score(p, d) for p, d in zip(problems, demos, strict=True)]
  assert len(set(demos)) > 900
  assert all(3 <= len(d) <= 10 and d.isalpha() and d.islower() for d in demos)
  assert statistics.pstdev(golds) > 0.2
  assert min(golds) < 0 < 0.75 <= max(golds)
  assert 0.05 < sum(gold_terms(p, d)["repeats"] > 0 for p, d in zip(problems, demos, strict=True)) / len(demos) < 0.5
  tok = CharTokenizer()
  assert tok.decode(tok.encode(problems[0].prompt + demos[0])) == problems[0].prompt + demos[0]
  # the SFT stream is a function of the task seed and the call order (resume replays it)
  again = SyntheticPreferences(seed=0)
  assert [again.reference_completion(p) for p in problems] == demos
  other = SyntheticPreferences(seed=1)
  assert [other.reference_completion(p) for p in problems] != demos


def test_prompts_split_and_serve_as_an_rl_task():
  task = make_task("preferences", seed=3, test_fraction=0.1)
  test = task.test_problems(None)
  train = list(task.train_problems(5000, seed=0)) + list(task.train_problems(5000, seed=1))
  assert 1000 < len(test) < 2500 and len({p.id for p in test}) == len(test)
  assert not {p.prompt for p in test} & {p.prompt for p in train}
  assert all(split_of(p.answer) == "test" for p in test) and all(split_of(p.answer) == "train" for p in train)
  p = train[0]
  assert p.task == "preferences" and p.prompt == p.answer + ":" and 3 <= len(p.answer) <= 4
  assert sorted(p.answer) == list(p.answer) and gold_score(p, p.reference) == 1.0
  assert [q.id for q in task.test_problems(50, seed=2)] == [q.id for q in task.test_problems(50, seed=2)]
  assert [q.id for q in task.train_problems(50, seed=2)] != [q.id for q in task.train_problems(50, seed=3)]


def test_pairs_are_deterministic_and_held_out_pairs_use_held_out_prompts():
  task = SyntheticPreferences()
  a = task.pairs("train", 300, seed=5, label_noise=0.1)
  assert a == task.pairs("train", 300, seed=5, label_noise=0.1)
  assert a != task.pairs("train", 300, seed=6, label_noise=0.1)
  assert all(p.chosen != p.rejected and p.gold_chosen != p.gold_rejected for p in a)
  assert all(p.gold_chosen == gold_score(p.prompt, p.chosen) for p in a)
  # candidates never depend on the noise level or beta: noise ablations differ only in labels
  b = SyntheticPreferences(beta=1.0).pairs("train", 300, seed=5, label_noise=0.0)
  assert [(p.prompt, {p.chosen, p.rejected}) for p in a] == [(p.prompt, {p.chosen, p.rejected}) for p in b]
  test_prompts = {p.prompt for p in task.test_problems(None)}
  held_out = task.pairs("test", 300, seed=5)
  assert {p.prompt for p in held_out} <= test_prompts
  assert not {p.prompt for p in task.pairs("train", 2000, seed=5)} & test_prompts


def test_label_noise_sets_the_agreement_with_the_gold():
  task = SyntheticPreferences()  # beta 100: the smallest gold gap (1/16) is labelled right 99.8% of the time
  clean = task.pairs("train", 2000, seed=0, label_noise=0.0)
  assert sum(p.agrees_with_gold for p in clean) / len(clean) > 0.995
  assert not any(p.label_flipped for p in clean)
  noisy = task.pairs("train", 2000, seed=0, label_noise=0.2)
  agree = sum(p.agrees_with_gold for p in noisy) / len(noisy)
  assert agree == pytest.approx(0.8, abs=0.03)  # 3 standard errors at n = 2000
  assert all(p.agrees_with_gold != p.label_flipped for p in noisy if abs(p.gold_chosen - p.gold_rejected) >= 0.25)
  hard = SyntheticPreferences(beta=math.inf).pairs("train", 500, seed=0)
  assert all(p.agrees_with_gold for p in hard)
  soft = SyntheticPreferences(beta=2.0).pairs("train", 2000, seed=0)  # Bradley–Terry sampling alone adds errors
  assert 0.55 < sum(p.agrees_with_gold for p in soft) / len(soft) < 0.75
  with pytest.raises(ValueError, match="label_noise"):
    task.pairs("train", 10, label_noise=0.6)
  with pytest.raises(ValueError, match="split"):
    task.pairs("valid", 10)


def test_the_cheap_correlate_predicts_the_labels():
  """More topic letters wins most clean pairs: the feature a proxy learns first, and the one the gold
  stops rewarding past 8 characters or on repeats (see the trade-off test)."""
  pairs = SyntheticPreferences().pairs("train", 2000, seed=1)
  rel = [gold_terms(p.prompt, p.chosen)["relevance"] - gold_terms(p.prompt, p.rejected)["relevance"] for p in pairs]
  assert sum(r > 0 for r in rel) / len(rel) > 0.75


def test_rewards_gold_and_correctness():
  task = SyntheticPreferences()
  p = task.make_problem("abd")
  gold = make_reward("preference_gold")
  r = gold(p, "abdb")
  assert (r.score, r.status, r.valid, r.info["repeats"], r.info["gold"]) == (0.5, "ok", True, 0.0, 0.5)
  correctness = build_reward({"correctness": 1.0})
  assert correctness(p, "abdabdab").score == 1.0  # gold 1.0
  assert correctness(p, "abdabd").score == 1.0  # gold 0.75: the default threshold
  assert correctness(p, "abdab").score == 0.0  # gold 0.625
  strict = build_reward({"correctness": 1.0}, {"preference_correct": {"threshold": 1.0}})
  assert strict(p, "abdabd").score == 0.0
  bad = gold(Problem("x", "1+1=", "2", task="arithmetic"), "abc")
  assert bad.status == "error" and not bad.valid


def test_load_pairs_jsonl_both_formats(tmp_path):
  path = tmp_path / "pairs.jsonl"
  hh_chosen = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Name a fruit.\n\nAssistant: An apple."
  hh_rejected = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Name a fruit.\n\nAssistant: No."
  lines = [
    json.dumps({"prompt": "abd:", "chosen": "abda", "rejected": "aaaa", "id": "p1"}),
    "",
    json.dumps({"chosen": hh_chosen, "rejected": hh_rejected}),
  ]
  path.write_text("\n".join(lines) + "\n")
  explicit, hh = load_pairs_jsonl(path)
  assert (explicit.prompt, explicit.chosen, explicit.rejected, explicit.id) == ("abd:", "abda", "aaaa", "p1")
  assert explicit.agrees_with_gold is None
  assert hh.prompt == "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Name a fruit.\n\nAssistant:"
  assert (hh.chosen, hh.rejected, hh.id) == (" An apple.", " No.", "pairs.jsonl:3")
  assert hh.prompt + hh.chosen == hh_chosen and hh.prompt + hh.rejected == hh_rejected


@pytest.mark.parametrize("line, message", [
  ("{not json", "not valid JSON"),
  ("[1, 2]", "expected a JSON object"),
  ('{"prompt": "a:", "chosen": "x"}', "missing field 'rejected'"),
  ('{"prompt": "a:", "chosen": "x", "rejected": 3}', "must be a string"),
  ('{"chosen": "plain text", "rejected": "\\n\\nHuman: q\\n\\nAssistant: a"}', "not an HH dialogue"),
  ('{"chosen": "\\n\\nHuman: q\\n\\nAssistant: a", "rejected": "\\n\\nHuman: Q\\n\\nAssistant: a"}', "differ"),
])
def test_load_pairs_jsonl_errors_name_file_and_line(tmp_path, line, message):
  path = tmp_path / "bad.jsonl"
  path.write_text(json.dumps({"prompt": "a:", "chosen": "x", "rejected": "y"}) + "\n" + line + "\n")
  with pytest.raises(ValueError, match=rf"bad\.jsonl:2: .*{message}"):
    load_pairs_jsonl(path)


def test_load_pairs_jsonl_skips_mismatched_hh_pairs_loudly_on_request(tmp_path):
  path = tmp_path / "hh.jsonl"
  good = {"chosen": "\n\nHuman: q\n\nAssistant: a", "rejected": "\n\nHuman: q\n\nAssistant: b"}
  bad = {"chosen": "\n\nHuman: q\n\nAssistant: a", "rejected": "\n\nHuman: Q\n\nAssistant: b"}
  path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
  with pytest.warns(UserWarning, match="skipped 1 HH pairs"):
    pairs = load_pairs_jsonl(path, skip_mismatched=True)
  assert len(pairs) == 1
  empty = tmp_path / "empty.jsonl"
  empty.write_text("\n")
  with pytest.raises(ValueError, match="no preference pairs"):
    load_pairs_jsonl(empty)
