"""Preference data: a synthetic task with a known gold reward, and a JSONL loader for real pairs.

Why a synthetic task: over-optimisation (Gao et al. 2022) can only be measured when the true reward is
known. Here a prompt names a few "topic letters" and the gold reward is a program, so a pipeline can
train a Bradley–Terry reward model on labelled pairs, optimise a policy against that learned proxy
(PPO with a KL leash, best-of-n, DPO) and read the gold score next to the proxy at every step.

Prompt: the topic letters, sorted, then a colon, e.g. "abd:" (3 or 4 distinct lowercase letters; about
17,500 prompts). `Problem.answer` holds the letters ("abd").

Gold score of a completion c (the text after the prompt, up to eos), with T the topic letters:

    gold(c) = (relevance - 1.5 * repeats - 1.5 * overlength) / 8
    relevance  = number of characters of c that are in T
    repeats    = number of positions i >= 1 with c[i] == c[i-1]
    overlength = max(0, len(c) - 8)

Examples for "abd:": "abdb" -> 4/8 = 0.5; "xyz" -> 0; "aaaa" -> (4 - 4.5)/8 = -0.0625;
"abdabdab" -> 1.0. The maximum, 1.0, is reached exactly by the 8-character completions made only of
topic letters with no character equal to its predecessor (`Problem.reference` is one). The score is
unbounded below (it falls linearly with length past 8), so it grows with neither repeats nor length.

Why these constants: with a length cost below 1 per character past 8, each extra topic letter would
net a gain and the gold would be maximised by endless completions; at 1.5 an extra
topic letter past the target nets -0.5 and a repeated topic letter nets -0.5, so "more topic letters"
(the cheap correlate, a feature a tiny reward model picks up first) helps only up to 8 distinct-
neighbour characters. Past that point it is exactly what hard optimisation of a proxy that learned
mostly "count the topic letters" will push for (runs like "aaaa...", completions longer than any in the
data), while the gold rises, peaks and falls: the trade-off the over-optimisation experiments need.
The demonstrations (below) are at most 10 characters long and repeat a character only occasionally,
so the penalties are seen less and extrapolated worse than the relevance term: in pairs labelled
without noise the chosen has more topic letters in ~82% of pairs, fewer repeats in ~27%, and is longer
about as often as shorter.

Demonstrations (`reference_completion`, the SFT data, and the candidates of every pair) are of mixed
quality, as in a real pipeline: a length uniform in DEMO_LENGTHS (3..10), a per-completion topic rate
uniform in TOPIC_RATE (0.1..0.9), each character a topic letter at that rate and another letter of
the alphabet otherwise (never its predecessor), except that with probability REPEAT_PROB (0.05) it
copies its predecessor. Their gold spreads widely (mean about 0.28, standard deviation about 0.28,
5%..95% range about -0.2..0.75), so pairs carry information. A tiny character model can raise the gold
by copying prompt letters, avoiding doubles and stopping at 8.

Labels (`SyntheticPreferences.pairs`): the two candidates are distinct demonstrations with different
gold scores (a tie would be a label with no information; tied candidates are redrawn). The first is
chosen with the Bradley–Terry probability sigmoid(beta * (g1 - g2)); then, with probability
`label_noise` = e (in [0, 0.5]), that label is flipped. So the fraction of labels agreeing with the gold
is (1 - e) * q + e * (1 - q), where q is the Bradley–Terry agreement; with the default beta = 100 the
smallest gold gap (1/16) already gives q = 0.998, so label_noise is very nearly the disagreement rate.
The random numbers drawn do not depend on label_noise or beta, so the same seed gives the same prompts
and candidates at every noise level: noise ablations differ only in their labels.

Splits: prompts are split train/test by a hash of the topic letters, as the arithmetic task splits
expressions; held-out pairs use held-out prompts only.

Real pairs: `load_pairs_jsonl` reads lines with "prompt", "chosen" and "rejected", or the Anthropic HH
form, whose "chosen" and "rejected" are whole dialogues "\\n\\nHuman: ...\\n\\nAssistant: ..."; there the
prompt is everything up to and including the last "\\n\\nAssistant:" and the response the rest (leading
space kept, so prompt + response is the original text).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import os
import random
import re
import string
import warnings
from collections.abc import Iterator
from pathlib import Path

from rl_lm.tasks.base import DataError, Problem, read_jsonl

TASK_NAME = "preferences"
TARGET_LEN = 8  # completions longer than this pay OVERLENGTH_PENALTY per extra character
REPEAT_PENALTY = 1.5  # per character equal to its predecessor
OVERLENGTH_PENALTY = 1.5  # per character past TARGET_LEN
TOPIC_SIZES = (3, 4)  # topic letters in a prompt
DEMO_LENGTHS = (3, 10)  # (min, max) length of a demonstration
TOPIC_RATE = (0.1, 0.9)  # (min, max) of a demonstration's share of topic letters, drawn once per demonstration
REPEAT_PROB = 0.05  # chance that a demonstration character copies its predecessor
_PROMPT_RE = re.compile(r"([a-z]+):")
_HH_ASSISTANT = "\n\nAssistant:"


# --- gold reward ---------------------------------------------------------------------------------


def topic_of(prompt_or_problem: Problem | str) -> str:
  """The topic letters of a problem (its `answer`) or of a prompt string "abd:"; ValueError otherwise."""
  if isinstance(prompt_or_problem, Problem):
    if prompt_or_problem.task == TASK_NAME:
      return prompt_or_problem.answer
    prompt_or_problem = prompt_or_problem.prompt
  m = _PROMPT_RE.fullmatch(prompt_or_problem)
  if not m:
    raise ValueError(f"not a synthetic preference prompt (lowercase letters then ':'): {prompt_or_problem[:40]!r}")
  return m.group(1)


def gold_terms(prompt_or_problem: Problem | str, completion: str) -> dict[str, float]:
  """The gold score and its parts: {"relevance", "repeats", "overlength", "score"} (see the module doc)."""
  topic = set(topic_of(prompt_or_problem))
  relevance = sum(ch in topic for ch in completion)
  repeats = sum(a == b for a, b in itertools.pairwise(completion))
  overlength = max(0, len(completion) - TARGET_LEN)
  score = (relevance - REPEAT_PENALTY * repeats - OVERLENGTH_PENALTY * overlength) / TARGET_LEN
  return {"relevance": float(relevance), "repeats": float(repeats), "overlength": float(overlength), "score": score}


def gold_score(prompt_or_problem: Problem | str, completion: str) -> float:
  """The gold reward of `completion` after the prompt (max 1.0; see the module doc for the formula)."""
  return gold_terms(prompt_or_problem, completion)["score"]


def optimal_completion(topic: str) -> str:
  """A gold-optimal completion (score 1.0): the topic letters cycled to TARGET_LEN characters."""
  return (topic * TARGET_LEN)[:TARGET_LEN]


def _sigmoid(x: float) -> float:
  if x >= 0:
    return 1.0 / (1.0 + math.exp(-x))
  z = math.exp(x)
  return z / (1.0 + z)


# --- pairs ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PreferencePair:
  """One labelled comparison: after `prompt`, `chosen` was preferred to `rejected`.

  Attributes:
    prompt: the shared context (synthetic: "abd:"; HH: the dialogue up to "\\n\\nAssistant:").
    chosen: the preferred response (without the prompt).
    rejected: the other response.
    id: stable identifier (synthetic: split, seed and index; loaded: file name and line number).
    gold_chosen, gold_rejected: gold scores when known (synthetic pairs), else None.
    label_flipped: True when the label-noise step swapped the Bradley–Terry label (synthetic only).
      Whether the label agrees with the gold is `agrees_with_gold`, which also counts Bradley–Terry
      sampling errors.
  """

  prompt: str
  chosen: str
  rejected: str
  id: str = ""
  gold_chosen: float | None = None
  gold_rejected: float | None = None
  label_flipped: bool = False

  @property
  def agrees_with_gold(self) -> bool | None:
    """Whether the chosen response has the higher gold score (None when the gold is unknown)."""
    if self.gold_chosen is None or self.gold_rejected is None:
      return None
    return self.gold_chosen > self.gold_rejected


# --- task ----------------------------------------------------------------------------------------


def split_of(topic: str, test_fraction: float = 0.1) -> str:
  """'test' or 'train', decided by a hash of the topic letters alone."""
  digest = hashlib.sha256(("rl_lm/preferences/split:" + topic).encode()).digest()
  return "test" if int.from_bytes(digest[:8], "big") % 1_000_000 < test_fraction * 1_000_000 else "train"


class SyntheticPreferences:
  """Synthetic preference task: topic-letter prompts, mixed-quality demonstrations, gold-labelled pairs.

  Serves as an RL task (`train_problems`, `test_problems`, `reference_completion`, the `Task` protocol)
  and as a source of preference pairs (`pairs`). See the module doc for the gold reward and labels.
  """

  name = TASK_NAME

  def __init__(self, seed: int = 0, test_fraction: float = 0.1, beta: float = 100.0) -> None:
    """Args:
      seed: seeds the demonstration stream of `reference_completion` (pairs take their own seed).
      test_fraction: share of topic sets (by hash) held out for evaluation and test pairs.
      beta: Bradley–Terry inverse temperature on the gold score; math.inf gives hard labels.
    """
    if not 0.0 < test_fraction < 1.0:
      raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if not beta > 0:
      raise ValueError(f"beta must be > 0, got {beta}")
    self.beta = float(beta)
    topics = ["".join(c) for k in TOPIC_SIZES for c in itertools.combinations(string.ascii_lowercase, k)]
    self._pools = {"train": [], "test": []}
    for t in topics:
      self._pools[split_of(t, test_fraction)].append(t)
    for split, pool in self._pools.items():
      if not pool:
        raise ValueError(f"no {split} prompts: {len(topics)} topic sets and test_fraction {test_fraction}")
    self._demo_rng = random.Random(f"rl_lm/preferences/demos/{seed}")

  def make_problem(self, topic: str) -> Problem:
    """The problem for topic letters `topic` (sorted, distinct); its `reference` is gold-optimal."""
    return Problem(id="pref-" + topic, prompt=topic + ":", answer=topic, task=TASK_NAME,
                   reference=optimal_completion(topic))

  def train_problems(self, n: int | None = None, seed: int = 0) -> Iterator[Problem]:
    """Training prompts drawn uniformly (repeats possible), endless when `n` is None."""
    rng = random.Random(f"rl_lm/preferences/train/{seed}")
    pool = self._pools["train"]
    for _ in range(n) if n is not None else itertools.count():
      yield self.make_problem(rng.choice(pool))

  def test_problems(self, n: int | None = 500, seed: int = 0) -> list[Problem]:
    """`n` distinct held-out prompts (all of them if the held-out pool is smaller, or if `n` is None)."""
    pool = self._pools["test"]
    rng = random.Random(f"rl_lm/preferences/test/{seed}")
    topics = rng.sample(pool, len(pool) if n is None else min(n, len(pool)))
    return [self.make_problem(t) for t in topics]

  def demonstration(self, rng: random.Random, topic: str) -> str:
    """One mixed-quality completion for `topic`, drawn with `rng` (the distribution in the module doc)."""
    off = [c for c in string.ascii_lowercase if c not in topic]
    rate = rng.uniform(*TOPIC_RATE)
    out: list[str] = []
    for _ in range(rng.randint(*DEMO_LENGTHS)):
      prev = out[-1] if out else ""
      if prev and rng.random() < REPEAT_PROB:
        out.append(prev)
        continue
      source = topic if rng.random() < rate else off  # neither runs out: topics have 3+ letters, 22+ are off
      out.append(rng.choice([c for c in source if c != prev]))
    return "".join(out)

  def reference_completion(self, problem: Problem) -> str:
    """The SFT target: a fresh mixed-quality demonstration, from the task's seeded stream.

    Successive calls advance that stream, so a resumed run that replays the calls in order sees the
    same targets. (`problem.reference` is the gold-optimal completion instead.)
    """
    return self.demonstration(self._demo_rng, topic_of(problem))

  def pairs(self, split: str, n: int, seed: int = 0, label_noise: float = 0.0) -> list[PreferencePair]:
    """`n` gold-labelled pairs on `split`'s prompts, deterministic in (split, n, seed, label_noise, beta).

    Labels: Bradley–Terry on the gold with inverse temperature `beta`, then flipped with probability
    `label_noise` (see the module doc). Candidates do not depend on `label_noise` or `beta`.
    """
    if split not in self._pools:
      raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if n < 0:
      raise ValueError(f"n must be >= 0, got {n}")
    if not 0.0 <= label_noise <= 0.5:
      raise ValueError(f"label_noise must be in [0, 0.5] (a flip probability; above 0.5 labels invert), "
                       f"got {label_noise}")
    rng = random.Random(f"rl_lm/preferences/pairs/{split}/{seed}")
    out = []
    for i in range(n):
      topic = rng.choice(self._pools[split])
      first = self.demonstration(rng, topic)
      g1 = gold_score(topic + ":", first)
      for _ in range(1000):
        second = self.demonstration(rng, topic)
        g2 = gold_score(topic + ":", second)
        if g2 != g1:
          break
      else:
        raise RuntimeError(f"no candidate with a gold score other than {g1} for topic {topic!r} in 1000 draws")
      u_bt, u_noise = rng.random(), rng.random()  # always drawn: candidates never depend on beta or noise
      flipped = u_noise < label_noise
      first_chosen = (u_bt < _sigmoid(self.beta * (g1 - g2))) != flipped  # beta = inf: sigmoid(+-inf) is 1 or 0
      (c, gc), (r, gr) = ((first, g1), (second, g2)) if first_chosen else ((second, g2), (first, g1))
      out.append(PreferencePair(topic + ":", c, r, f"pref-{split}-{seed}-{i}", gc, gr, flipped))
    return out


# --- real pairs ----------------------------------------------------------------------------------


def _split_hh(row: dict, key: str, where: str) -> tuple[str, str]:
  """(prompt through the last "\\n\\nAssistant:", response) of the HH dialogue `row[key]`."""
  head, turn, response = row[key].rpartition(_HH_ASSISTANT)
  if not turn:
    raise DataError(f"{where}: no 'prompt' field, and {key!r} is not an HH dialogue (no '\\n\\nAssistant:' turn)")
  return head + turn, response


def load_pairs_jsonl(path: str | os.PathLike[str], skip_mismatched: bool = False) -> list[PreferencePair]:
  """Preference pairs from a JSONL file: {"prompt", "chosen", "rejected"} lines, or Anthropic HH lines.

  A line without "prompt" is read as HH: "chosen" and "rejected" are whole dialogues, each split at its
  last "\\n\\nAssistant:" (see the module doc); the two prompts must be equal. An optional "id" is kept,
  else the id is "<file name>:<line number>". Blank lines are skipped.

  Raises DataError (a ValueError) naming the file and line for malformed JSON, missing or non-string fields,
  an HH dialogue without an assistant turn, and HH pairs whose prompts differ (unless `skip_mismatched`,
  which drops those with one warning giving their count), and naming the file when it holds no pairs.
  """
  path = Path(path)
  out: list[PreferencePair] = []
  mismatched: list[int] = []
  for lineno, row in read_jsonl(path, what="preference pairs"):
    where = f"{path}:{lineno}"
    for key in ("chosen", "rejected") + (("prompt",) if "prompt" in row else ()):
      if key not in row:
        raise DataError(f"{where}: missing field {key!r} (need 'prompt', 'chosen', 'rejected', "
                        "or HH 'chosen' and 'rejected')")
      if not isinstance(row[key], str):
        raise DataError(f"{where}: field {key!r} must be a string, got {type(row[key]).__name__} "
                        "(chat-message lists must be rendered with a chat template first)")
    pair_id = str(row.get("id", f"{path.name}:{lineno}"))
    if "prompt" in row:
      out.append(PreferencePair(row["prompt"], row["chosen"], row["rejected"], pair_id))
      continue
    chosen, rejected = _split_hh(row, "chosen", where), _split_hh(row, "rejected", where)
    if chosen[0] != rejected[0]:
      if skip_mismatched:
        mismatched.append(lineno)
        continue
      raise DataError(f"{where}: HH 'chosen' and 'rejected' dialogues differ before their last assistant turn")
    out.append(PreferencePair(chosen[0], chosen[1], rejected[1], pair_id))
  if mismatched:
    warnings.warn(f"{path}: skipped {len(mismatched)} HH pairs whose prompts differ (first at line {mismatched[0]})",
                  stacklevel=2)
  if not out:
    raise DataError(f"{path} holds no preference pairs (every HH pair was skipped)")
  return out
