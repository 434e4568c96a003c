"""An LLM judge's verdicts, read from its next-token distribution, never parsed from free text.

The judge (a frozen model, like the teacher: rl_lm/train/teacher.py) reads a prompt that ends where its answer
begins, and one forward gives its distribution over the next token (`next_token_logprobs`).

Pointwise (a rubric, a score from 1 to K): the score is the expectation of the score values under the next-token
distribution restricted to the score tokens,

  score = sum_k v_k p(t_k) / sum_k p(t_k),    mass = sum_k p(t_k).

The mass says whether the judge answered on the scale at all: below `min_mass` the row is a judge failure (masked
and counted as a verifier fault is, never a score of 0 or of the scale's middle).

Pairwise (which of two answers is better, "1" or "2"): both orders are shown, A first then B first, and

  q1 = p("1" | A, B) / (p("1") + p("2")),   q2 = p("2" | B, A) / (p("1") + p("2")),   P(A > B) = (q1 + q2) / 2.

Swapping A and B swaps the two prompts, so P(B > A) = 1 - P(A > B) exactly: the average cancels the judge's
preference for a position. That preference is measured, not hidden: `first_rate` is how often the judge picks the
answer shown first (0.5: no position bias), `flip_rate` how often its choice changes when the order does.

As rewards ("judge" and "judge_pairwise", registered in rl_lm/rewards/judged.py; `config.judge`): the judge is a
frozen model on the mesh (`JudgeModel`), the texts re-tokenised with its own tokenizer, its prompts run `rows` at a
time. A row the judge cannot decide is masked and counted, never scored 0: "judge_invalid" (too little mass on the
answer tokens: an answer off the scale) and "judge_error" (a non-finite output, or a forward that raised). A
completion the judge cannot read is the completion's doing and scores 0, valid, counted: "judge_overlong" (its
prompt does not fit `max_len` tokens) and "judge_unreadable" (a character the judge's tokenizer cannot encode);
masking those would let a policy escape a low score by writing long or strange text. When the prompt does not fit or
encode even with an empty completion, the setup is at fault: "judge_error", masked. The verdict math runs on the
host, in numpy, on the answer tokens' log-probs the device sends back ([n, K] a batch).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rl_lm import mesh as mesh_lib
from rl_lm.models import transformer
from rl_lm.models.presets import ModelConfig
from rl_lm.rewards.registry import RewardResult
from rl_lm.tasks.base import Problem


@functools.partial(jax.jit, static_argnums=0)
def next_token_logprobs(cfg: ModelConfig, params: transformer.Params, tokens: jax.Array, lengths: jax.Array
                        ) -> jax.Array:
  """log p(next token | tokens[b, :lengths[b]]) for right-padded prompts tokens [B, L]. -> [B, V] float32."""
  mask = jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]
  h = transformer.hidden_states(cfg, params, tokens, mask)  # [B, L, D]
  last = jnp.take_along_axis(h, jnp.maximum(lengths - 1, 0)[:, None, None], axis=1)  # [B, 1, D]
  logits = transformer.logits_from_hidden(cfg, params, last)[:, 0]  # [B, V]
  return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)


def make_answers_fn(cfg: ModelConfig, mesh: Any = None, rules: mesh_lib.Rules = mesh_lib.DEFAULT_RULES) -> Callable:
  """jit(params, tokens [rows, L] int32, lengths [rows] int32, ids [K] int32) -> [rows, K] float32: the judge's
  log-probs of the answer tokens `ids` after each right-padded prompt. What `JudgeModel` runs and `rl_lm.aot`
  compiles."""

  def answers(params: Any, tokens: jax.Array, lengths: jax.Array, ids: jax.Array) -> jax.Array:
    return next_token_logprobs(cfg, params, tokens, lengths)[:, ids]  # [rows, K]

  return jax.jit(mesh_lib.bind(answers, mesh, rules))


def padded_length(longest: int, max_len: int) -> int:
  """The judge forward's width for prompts of at most `longest` tokens: the next power of two (at least 16), capped
  at `max_len`. A few compiled shapes, and no forward pays for `max_len` when its prompts are short."""
  return min(max_len, max(16, 1 << (longest - 1).bit_length()))


class Pointwise(NamedTuple):
  score: np.ndarray  # [B] float32: the expected score (NaN where not valid)
  mass: np.ndarray  # [B] float32: the probability of answering with a score token
  valid: np.ndarray  # [B] bool: mass >= min_mass


def pointwise(logp: Any, score_ids: Any, values: Any, min_mass: float) -> Pointwise:
  """logp [B, V] next-token log-probs; score_ids [K] the tokens of the scale, values [K] what each means."""
  p = np.exp(np.asarray(logp, np.float64)[:, np.asarray(score_ids)])  # [B, K]
  mass = np.sum(p, axis=1)
  score = np.sum(p * np.asarray(values, np.float64)[None, :], axis=1) / np.maximum(mass, 1e-30)
  valid = np.isfinite(score) & (mass >= min_mass)
  return Pointwise(np.where(valid, score, np.nan).astype(np.float32), mass.astype(np.float32), valid)


class Pairwise(NamedTuple):
  p_first: np.ndarray  # [B] float32: P(A > B), the two orders averaged (NaN where not valid)
  q_a_first: np.ndarray  # [B]: P(A > B) when A is shown first
  q_b_first: np.ndarray  # [B]: P(A > B) when B is shown first
  valid: np.ndarray  # [B] bool: both orders answered "1" or "2" with at least min_mass


def pairwise(logp_a_first: Any, logp_b_first: Any, one: int, two: int, min_mass: float) -> Pairwise:
  """logp_* [B, V]: the judge's next-token log-probs after (A, B) and after (B, A); `one`, `two`: the ids of the
  answer tokens "1" and "2"."""

  def first_wins(logp: Any) -> tuple[np.ndarray, np.ndarray]:
    logp = np.asarray(logp, np.float64)
    p1, p2 = np.exp(logp[:, one]), np.exp(logp[:, two])
    return p1 / np.maximum(p1 + p2, 1e-30), p1 + p2

  q1, m1 = first_wins(logp_a_first)
  b_first, m2 = first_wins(logp_b_first)
  q2 = 1.0 - b_first  # B shown first: A wins when the judge says "2"
  valid = np.isfinite(q1) & np.isfinite(q2) & (m1 >= min_mass) & (m2 >= min_mass)
  f32 = lambda x: x.astype(np.float32)  # noqa: E731
  return Pairwise(f32(np.where(valid, (q1 + q2) / 2, np.nan)), f32(q1), f32(q2), valid)


def position_bias(result: Pairwise) -> dict[str, float]:
  """judge/first_rate: how often the answer shown first is picked (over both orders of every valid pair; 0.5
  is none), judge/flip_rate: the share of valid pairs whose winner changes with the order."""
  v = np.asarray(result.valid, np.float64)
  n = max(float(np.sum(v)), 1.0)
  qa, qb = np.asarray(result.q_a_first), np.asarray(result.q_b_first)
  picks_first = ((qa > 0.5).astype(np.float64) + (qb < 0.5).astype(np.float64)) / 2
  flips = (qa > 0.5) != (qb > 0.5)
  return {"judge/first_rate": float(np.sum(picks_first * v) / n), "judge/flip_rate": float(np.sum(flips * v) / n),
          "judge/invalid_frac": float(1.0 - np.mean(v)) if v.size else 0.0}


# ------------------------------------------------------------------------------------------------
# The judge as a reward


class JudgeModel:
  """A frozen judge on the mesh with its own tokenizer: the log-probs of a few answer tokens after each prompt."""

  def __init__(self, cfg: ModelConfig, params: Any, tokenizer: Any, rows: int, max_len: int, mesh: Any = None,
               rules: mesh_lib.Rules = mesh_lib.DEFAULT_RULES):
    self.cfg, self.params, self.tokenizer, self.rows, self.max_len = cfg, params, tokenizer, rows, max_len
    self.last_error = ""  # the last exception a forward raised (its rows were judge_error)
    self.mesh = mesh
    self._sharding = mesh_lib.batch_sharding(mesh, rules, (rows,)) if mesh is not None else None

    self._answers = make_answers_fn(cfg, mesh, rules)

  def token_id(self, text: str, key: str) -> int:
    """The one token `text` is to the judge's tokenizer; refuses a text of several tokens, naming `key`."""
    ids = self.tokenizer.encode(text)
    if len(ids) != 1:
      from rl_lm.config.section import ConfigError

      raise ConfigError(key, f"{text!r} is {len(ids)} tokens to the judge's tokenizer; an answer must be one token")
    return ids[0]

  def encode(self, prompt: str) -> list[int] | None:
    """The prompt's tokens, or None when the judge's tokenizer cannot encode it."""
    try:
      return self.tokenizer.encode_prompt(prompt)
    except ValueError:
      return None

  def answer_logprobs(self, prompts: Sequence[str], ids: Sequence[int]) -> tuple[np.ndarray, list[str]]:
    """log p(answer token k | prompt i) [n, K] float32 (NaN where not scored), and each prompt's status: "ok",
    "judge_unreadable", "judge_overlong" or "judge_error" (a non-finite output, or a forward that raised: its
    rows are the judge's failure, masked and counted like a verifier's crash; the error is kept in `last_error`)."""
    encoded = [self.encode(p) or [] for p in prompts]
    status = ["judge_unreadable" if not e else "ok" if len(e) <= self.max_len else "judge_overlong" for e in encoded]
    out = np.full((len(prompts), len(ids)), np.nan, np.float32)
    todo = [i for i, s in enumerate(status) if s == "ok"]
    put = lambda x: mesh_lib.put(x, self._sharding) if self._sharding is not None else jnp.asarray(x)  # noqa: E731
    id_array = mesh_lib.put(np.asarray(ids, np.int32), mesh_lib.replicated(self.mesh)) if self.mesh else \
      jnp.asarray(np.asarray(ids, np.int32))
    for start in range(0, len(todo), self.rows):
      part = todo[start: start + self.rows]
      width = padded_length(max(len(encoded[i]) for i in part), self.max_len)
      tokens = np.full((self.rows, width), self.tokenizer.pad_id, np.int32)
      lengths = np.ones((self.rows,), np.int32)  # padding rows: one pad token, their answers dropped
      for r, i in enumerate(part):
        tokens[r, : len(encoded[i])], lengths[r] = encoded[i], len(encoded[i])
      try:
        got = mesh_lib.fetch(self._answers(self.params, put(tokens), put(lengths), id_array))[: len(part)]
      except Exception as e:  # a judge that crashes (out of memory, a runtime error) fails its rows, never the run
        self.last_error = f"{type(e).__name__}: {e}"
        got = np.full((len(part), len(ids)), np.nan, np.float32)
      out[part] = got
    for i in todo:
      if not np.all(np.isfinite(out[i])):
        status[i] = "judge_error"
    return out, status


UNREADABLE = {"judge_overlong": "the judge's prompt does not fit judge.max_len tokens",
              "judge_unreadable": "the judge's tokenizer cannot encode the text"}  # the completion's doing: a valid 0


def _own_fault(judge: JudgeModel, status: list[str], empty: Sequence[str]) -> list[str]:
  """A prompt too long or unreadable only with the completion in it is the completion's doing; one that is so
  with an empty completion is the setup's (the question, the template or judge.max_len): "judge_error", masked."""
  out = list(status)
  for i, s in enumerate(status):
    if s in UNREADABLE:
      ids = judge.encode(empty[i])
      if ids is None or len(ids) > judge.max_len:
        out[i] = "judge_error"
  return out


def _verdict(status: str, valid: bool, score: float, info: dict[str, float], detail: str) -> RewardResult:
  """The reward of one row: the judge's score; 0 for a text it cannot read; masked where the judge failed."""
  if status in UNREADABLE:
    return RewardResult(0.0, status, {"judge": UNREADABLE[status]}, valid=True)
  if status != "ok":
    return RewardResult(0.0, status, {"judge": "a non-finite log-prob, a forward that raised, or a prompt too long "
                                      "or unreadable without the completion"}, valid=False)
  if not valid:
    return RewardResult(0.0, "judge_invalid", {"judge": detail}, valid=False)
  return RewardResult(score, "ok", info)


def _stats(results: Sequence[RewardResult]) -> dict[str, float]:
  n = max(len(results), 1)
  return {"judge/invalid_frac": sum(not r.valid for r in results) / n,
          "judge/unreadable_frac": sum(r.status in UNREADABLE for r in results) / n}


class PointwiseJudge:
  """The "judge" reward: the rubric's expected score, mapped to [0, 1] (worst answer token 0, best 1)."""

  name = "judge"

  def __init__(self, judge: JudgeModel, rubric: str, scale: str, min_mass: float):
    self.judge, self.rubric, self.min_mass = judge, rubric, min_mass
    self.ids = [judge.token_id(t, "config.judge.scale") for t in scale]
    self.values = np.linspace(0.0, 1.0, len(scale))
    self.stats: dict[str, float] = {}

  def __call__(self, problem: Problem, completion: str) -> RewardResult:
    return self.batch([problem], [completion])[0]

  def batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardResult]:
    prompts = [self.rubric.format(prompt=p.prompt, completion=c) for p, c in zip(problems, completions, strict=True)]
    logp, status = self.judge.answer_logprobs(prompts, self.ids)
    status = _own_fault(self.judge, status, [self.rubric.format(prompt=p.prompt, completion="") for p in problems])
    verdict = pointwise(logp, np.arange(len(self.ids)), self.values, self.min_mass)
    out = [_verdict(s, bool(verdict.valid[i]), float(verdict.score[i]), {"mass": float(verdict.mass[i])},
                    f"mass {verdict.mass[i]:.3f} on the scale, below {self.min_mass}") for i, s in enumerate(status)]
    self.stats = _stats(out)
    return out


class PairwiseJudge:
  """The "judge_pairwise" reward: P(the completion is better than the problem's reference), both orders averaged;
  the position bias of every batch is measured (`stats`)."""

  name = "judge_pairwise"

  def __init__(self, judge: JudgeModel, compare: str, choices: str, min_mass: float):
    self.judge, self.compare, self.min_mass = judge, compare, min_mass
    self.one, self.two = (judge.token_id(t, "config.judge.choices") for t in choices)
    self.stats: dict[str, float] = {}
    self.totals = np.zeros(3)  # over the run: valid pairs, picks of the answer shown first, flips

  def summary(self) -> str:
    """The run's measured position bias, one line."""
    n, first, flips = self.totals
    if not n:
      return "judge: no valid pair judged"
    return (f"judge: position bias over {int(n):,} pairs: picks the answer shown first {first / n:.1%} of the "
            f"time (50%: none), changes its choice with the order for {flips / n:.1%} of pairs")

  def __call__(self, problem: Problem, completion: str) -> RewardResult:
    return self.batch([problem], [completion])[0]

  def prefer(self, prompts: Sequence[str], a: Sequence[str], b: Sequence[str]) -> tuple[Pairwise, list[str]]:
    """P(a > b) for each pair, and each pair's status (the worse of its two orders'); the position bias is added
    to the run's totals (`summary`)."""
    n = len(prompts)
    texts = [self.compare.format(prompt=q, first=x, second=y) for q, x, y in zip(prompts, a, b, strict=True)]
    texts += [self.compare.format(prompt=q, first=y, second=x) for q, x, y in zip(prompts, a, b, strict=True)]
    logp, status = self.judge.answer_logprobs(texts, [self.one, self.two])
    empty = [self.compare.format(prompt=q, first="", second=y) for q, y in zip(prompts, b, strict=True)]
    empty += [self.compare.format(prompt=q, first=y, second="") for q, y in zip(prompts, b, strict=True)]
    status = _own_fault(self.judge, status, empty)  # the first side (the completion) emptied in either order
    both = [s1 if s1 != "ok" else s2 for s1, s2 in zip(status[:n], status[n:], strict=True)]
    verdict = pairwise(logp[:n], logp[n:], 0, 1, self.min_mass)
    bias, valid = position_bias(verdict), float(np.sum(verdict.valid))
    self.totals += (valid, bias["judge/first_rate"] * valid, bias["judge/flip_rate"] * valid)
    return verdict, both

  def batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardResult]:
    missing = [p.id for p in problems if not p.reference]
    if missing:
      raise ValueError(f"judge_pairwise compares a completion with the problem's reference; {missing[0]} has none")
    verdict, status = self.prefer([p.prompt for p in problems], completions, [p.reference for p in problems])
    out = [_verdict(s, bool(verdict.valid[i]), float(verdict.p_first[i]),
                    {"q_a_first": float(verdict.q_a_first[i]), "q_b_first": float(verdict.q_b_first[i])},
                    f"under {self.min_mass} of the mass on the two choices") for i, s in enumerate(status)]
    self.stats = {**position_bias(verdict), **_stats(out)}
    return out
