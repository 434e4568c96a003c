"""Preference pairs for the reward-model and DPO stages: where they come from, how they become tokens,
and which ones a step trains on.

Pairs come from the synthetic task (`config.preferences.source = "synthetic"`, labelled through a
Bradley-Terry model of its gold score with `label_noise` flips) or from a JSONL file (the file's last
`eval_pairs` lines are held out). Each side is encoded like an SFT example, `[bos] prompt completion
[eos]` right-padded to `preferences.max_len`, with `loss_mask` marking the completion and its eos.
Step `s` trains on a fixed slice of a per-epoch permutation, so a resumed run sees the same batches.
"""

from __future__ import annotations

from collections.abc import Sequence
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
