"""What a rollout is made of: how tokens are drawn (`SamplingConfig`) and what a sampler returns (`Rollout`).

Layout of a `Rollout` from `rl_lm.sampling.generate` (static or continuous batching): prompts come in right-padded
(`prompts[b, :prompt_lengths[b]]` are real) and leave pushed to the right edge of their P slots, so row b's prompt
sits in slots [P - len_b, P) and its completion in [P, P + lengths[b]); slots after a row's end hold `pad_id`.
`prompt_mask | completion_mask` is the attention mask to score it with `transformer.forward`, which gives the
positions the sampler used. A multi-turn episode (`rl_lm.rollout.turns`) is written left to right from slot 0,
observation tokens as the prompt mask and the policy's tokens as the completion mask.

Log-probs: `logprobs[b, t]` is log softmax(logits / temperature)[token] of the full, untruncated vocabulary (top-k
and top-p change which tokens can be drawn, not the reported distribution), what a trainer computes from `forward`
logits divided by the same temperature. Greedy decoding reports temperature-1 log-probs. Entries off the completion
are 0.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax

from rl_lm.config import Sampling


@dataclasses.dataclass(frozen=True)
class SamplingConfig(Sampling):
  """How to draw completions: the `config.sampling` knobs (defaults and checks there), and the tokenizer's tokens."""

  stop_tokens: tuple[int, ...] = ()  # default stop set for every row
  pad_id: int = 0


class Rollout(NamedTuple):
  """Sampled completions (or episodes) in the layout described in the module docstring."""

  tokens: jax.Array  # [B, P + N] int32
  prompt_mask: jax.Array  # [B, P + N] bool
  completion_mask: jax.Array  # [B, P + N] bool
  logprobs: jax.Array  # [B, P + N] float32, sampler log-probs of completion tokens, 0 elsewhere
  lengths: jax.Array  # [B] int32, completion tokens per row (stop token included)
  finished: jax.Array  # [B] bool, stopped on a stop token rather than truncated


