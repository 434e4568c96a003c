"""Preference pairs for the reward-model and DPO stages: where they come from, how they become tokens,
and which ones a step trains on.

Pairs come from the synthetic task (`config.preferences.source = "synthetic"`, labelled through a
Bradley-Terry model of its gold score with `label_noise` flips) or from a JSONL file (the file's last
`eval_pairs` lines are held out). Each side is encoded like an SFT example, `[bos] prompt completion
[eos]` right-padded to `preferences.max_len`, with `loss_mask` marking the completion and its eos.
Step `s` trains on a fixed slice of a per-epoch permutation, so a resumed run sees the same batches.

RLAIF (`config.preferences.labeller = "judge"`): the training pairs are relabelled by the pairwise LLM judge
(`config.judge`, rl_lm/rewards/judge.py; both orders averaged), the pairs it cannot decide dropped and counted
(`relabel`). Its agreement with the gold, its position bias and its length bias are measured on the way and
written to `<workdir>/judge_labels.json`; the held-out pairs keep their labels, so the reward model is
evaluated against the same labels whoever labelled its training pairs.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rl_lm import tokenizer as tokenizer_lib
from rl_lm.tasks.base import Task
from rl_lm.tasks.preferences import PreferencePair, SyntheticPreferences, load_pairs_jsonl
from rl_lm.train.sft import encode_examples


def load(config: Any, task: Task) -> tuple[list[PreferencePair], list[PreferencePair]]:
  """(train pairs, held-out pairs) as `config.preferences` says."""
  p = config.preferences
  if p.source == "synthetic":
    if not isinstance(task, SyntheticPreferences):
      raise ValueError(f"synthetic preference pairs need task 'preferences', got {getattr(task, 'name', task)!r}")
    return (task.pairs("train", p.train_pairs, seed=config.seed, label_noise=p.label_noise),
            task.pairs("test", p.eval_pairs, seed=config.seed, label_noise=p.label_noise))
  pairs = load_pairs_jsonl(p.source)
  if len(pairs) <= p.eval_pairs:
    raise ValueError(f"{p.source}: {len(pairs)} pairs, not more than config.preferences.eval_pairs={p.eval_pairs}")
  return pairs[: -p.eval_pairs], pairs[-p.eval_pairs:]


def encode(tok: tokenizer_lib.Tokenizer, pairs: Sequence[PreferencePair], max_len: int) -> dict[str, np.ndarray]:
  """chosen_tokens / chosen_mask / chosen_loss_mask and the rejected ones, each [n, max_len]; `truncated`
  counts sides cut at max_len (their eos is lost)."""
  chosen = encode_examples(tok, [(q.prompt, q.chosen) for q in pairs], max_len)
  rejected = encode_examples(tok, [(q.prompt, q.rejected) for q in pairs], max_len)
  out = {f"chosen_{k}": v for k, v in chosen.items() if k != "truncated"}
  out.update({f"rejected_{k}": v for k, v in rejected.items() if k != "truncated"})
  out["truncated"] = np.int32(chosen["truncated"] + rejected["truncated"])
  return out


def step_indices(n: int, batch_size: int, step: int, seed: int) -> np.ndarray:
  """The pairs step `step` (0-based) trains on: consecutive slices of a fresh permutation each epoch. [batch]"""
  per_epoch = max(n // batch_size, 1)
  epoch, k = divmod(step, per_epoch)
  order = np.random.default_rng([seed, epoch]).permutation(n)
  return order[k * batch_size: (k + 1) * batch_size]


def take(data: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
  return {k: v[rows] for k, v in data.items() if k != "truncated"}


def relabel(pairs: Sequence[PreferencePair], judge: Any) -> tuple[list[PreferencePair], dict[str, float]]:
  """The pairs as the pairwise judge (`rewards.judge.PairwiseJudge`) labels them: chosen is the side it prefers
  (P > 0.5 over both orders); pairs it cannot decide (an invalid or unreadable verdict, or exactly 0.5) are
  dropped. Returns (pairs, judge/* statistics over the pairs it labelled): agreement with the gold where the
  gold is known, agreement with the given labels, position bias, and how often it and the gold pick the longer
  response (length bias)."""
  verdict, status = judge.prefer([q.prompt for q in pairs], [q.chosen for q in pairs], [q.rejected for q in pairs])
  out, agree_given, agree_gold, gold_known, longer, gold_longer, unequal, gold_unequal = [], 0, 0, 0, 0, 0, 0, 0
  for q, p, s, ok in zip(pairs, verdict.p_first, status, verdict.valid, strict=True):
    if s != "ok" or not ok or p == 0.5:
      continue
    keep = p > 0.5
    new = q if keep else dataclasses.replace(q, chosen=q.rejected, rejected=q.chosen, gold_chosen=q.gold_rejected,
                                             gold_rejected=q.gold_chosen)
    out.append(new)
    agree_given += keep
    if new.agrees_with_gold is not None:
      gold_known += 1
      agree_gold += new.agrees_with_gold
    if len(q.chosen) != len(q.rejected):
      unequal += 1
      longer += len(new.chosen) > len(new.rejected)
      if new.agrees_with_gold is not None:  # the gold prefers the longer side
        gold_unequal += 1
        gold_longer += (len(new.chosen) > len(new.rejected)) == new.agrees_with_gold
  n = max(len(out), 1)
  stats = {"judge/pairs": float(len(out)), "judge/dropped": float(len(pairs) - len(out)),
           "judge/agreement_given": agree_given / n,
           "judge/agreement_gold": agree_gold / gold_known if gold_known else float("nan"),
           "judge/longer_rate": longer / unequal if unequal else float("nan"),
           "judge/gold_longer_rate": gold_longer / gold_unequal if gold_unequal else float("nan")}
  from rl_lm.rewards.judge import position_bias

  stats.update({k: v for k, v in position_bias(verdict).items() if k != "judge/invalid_frac"})
  return out, stats


def load_for_stage(ctx: Any, task: Task, stage: str, log: Callable[[str], Any] = print
                   ) -> tuple[list[PreferencePair], list[PreferencePair]]:
  """`load`, with the training pairs relabelled by the judge under RLAIF (`preferences.labeller = "judge"`)."""
  config = ctx.config
  train_pairs, eval_pairs = load(config, task)
  if config.preferences.labeller != "judge":
    return train_pairs, eval_pairs
  from rl_lm.rewards.judge import PairwiseJudge
  from rl_lm.train import teacher

  j = config.judge
  judge = PairwiseJudge(teacher.load_judge(config, ctx, log), j.compare, j.choices, j.min_mass)
  train_pairs, stats = relabel(train_pairs, judge)
  log(f"{stage}: AI labels: {int(stats['judge/pairs'])} pairs labelled by the judge ({int(stats['judge/dropped'])} "
      f"undecided, dropped); agreement with the gold {stats['judge/agreement_gold']:.1%}; {judge.summary()}; "
      f"picks the longer response {stats['judge/longer_rate']:.1%} (the gold: {stats['judge/gold_longer_rate']:.1%})")
  if not train_pairs:
    raise ValueError(f"{stage}: the judge decided none of {len(train_pairs) + int(stats['judge/dropped'])} pairs")
  if ctx.workdir:
    with open(os.path.join(ctx.workdir, "judge_labels.json"), "w") as f:
      json.dump({"stage": stage, **stats}, f, indent=1)
  return train_pairs, eval_pairs
