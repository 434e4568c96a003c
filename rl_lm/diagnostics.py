"""Run-health metrics, computed every RL step, and alarms on them.

`rollout_metrics` takes the rollout arrays ([B, T] per token, [B] per episode, rows of a group adjacent)
and returns a dict of scalar arrays; it is pure jnp and jittable with `group_size` and
`max_new_tokens` static:

  jax.jit(diagnostics.rollout_metrics, static_argnames=("group_size", "max_new_tokens"))

Every mean is guarded: an all-masked batch, an empty group or a batch without valid episodes gives 0,
never NaN. Optional inputs that are None simply drop their metrics, so the key set depends only on which
inputs were given (static under jit).

Masks used:
  - episode metrics over rewards (reward mean/std, pass rate) use the `valid` episodes (the verifier
    could decide); length and truncation use every episode; `rollout/invalid_frac` counts the rest.
  - token metrics (KL, entropy, sampler/trainer gap, importance weights, explained variance) use
    `completion_mask`: every sampled completion token, whether or not its episode's verifier succeeded,
    since they describe the policy and the numerics rather than the reward.

`perf_metrics` turns phase timings into throughput; `check_alarms` turns a metrics dict into
human-readable alarm lines ("ALARM policy/entropy=0.012 < 0.05: entropy collapsed"; rules in rl_lm.health).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from rl_lm.config import AlarmConfig  # the thresholds, with their defaults and checks
from rl_lm.rl import advantages, kl, masked

Array = Any  # jax.Array or np.ndarray


def _f32(x: Array) -> jax.Array:
  return jnp.asarray(x, jnp.float32)


def rollout_metrics(
  *,
  scores: Array,
  valid: Array,
  completion_mask: Array,
  group_size: int,
  success: Array | None = None,
  lengths: Array | None = None,
  truncated: Array | None = None,
  max_new_tokens: int | None = None,
  logprobs: Array | None = None,
  sampler_logprobs: Array | None = None,
  ref_logprobs: Array | None = None,
  entropy: Array | None = None,
  values: Array | None = None,
  returns: Array | None = None,
  is_weights: Array | None = None,
) -> dict[str, jax.Array]:
  """Run-health metrics of one rollout batch (B = prompts x group_size episodes, T tokens).

  Args:
    scores: [B] rewards.
    valid: [B] bool, the verifier could score the episode.
    completion_mask: [B, T] bool, the sampled completion tokens.
    group_size: episodes per prompt; rows of a group are adjacent; B must be a multiple of it.
    success: [B] bool, the episode solved its problem (for "rollout/pass_rate" and the group solve
      fractions); omitted -> those keys are absent.
    lengths: [B] completion lengths; default `completion_mask.sum(-1)`.
    truncated: [B] bool, generation hit max_new_tokens without a stop token; if None and
      `max_new_tokens` is given, `lengths >= max_new_tokens` is used instead; if both are None the
      truncation rate is absent.
    logprobs: [B, T] trainer ("old") log-probs of the sampled tokens.
    sampler_logprobs: [B, T] the sampler's own log-probs of the same tokens.
    ref_logprobs: [B, T] reference-model log-probs; KL uses `logprobs` (or `sampler_logprobs` if no
      trainer log-probs were given).
    entropy: [B, T] per-token policy entropy.
    values, returns: [B, T] PPO value predictions and returns, for "value/explained_variance".
    is_weights: [B, T] importance weights applied to the loss (e.g. truncated IS).

  Returns:
    {name: float32 scalar}. Keys: rollout/{reward_mean, reward_std, pass_rate, response_length_mean,
    response_length_max, response_length_correct, response_length_incorrect (valid episodes solved / not
    solved; 0 when there are none), truncation_rate, invalid_frac, completion_tokens},
    groups/{zero_variance_frac, solve_all_frac, solve_none_frac}, policy/{kl_ref_k1, kl_ref_k3, kl_ref_seq, entropy},
    offpolicy/{logprob_gap_mean_abs, logprob_gap_max, sampler_trainer_kl, is_weight_mean, is_weight_max},
    value/explained_variance; each only when its inputs were given.
  """
  scores = _f32(scores)
  valid = jnp.asarray(valid, bool)
  mask = jnp.asarray(completion_mask, bool)
  (b,) = scores.shape
  if group_size < 1 or b % group_size:
    raise ValueError(f"rollout_metrics: batch of {b} episodes is not a multiple of group_size={group_size}")
  lengths = jnp.sum(mask, axis=-1) if lengths is None else jnp.asarray(lengths)
  lengths = _f32(lengths)
  m: dict[str, jax.Array] = {}

  # Episodes.
  m["rollout/reward_mean"] = masked.masked_mean(scores, valid)
  m["rollout/reward_std"] = jnp.sqrt(masked.masked_var(scores, valid))
  if success is not None:
    solved = jnp.asarray(success, bool)
    m["rollout/pass_rate"] = masked.masked_mean(_f32(solved), valid)
    # Length by outcome (Liu et al. 2025: GRPO's length normalisation lengthens the wrong ones); 0 with none.
    m["rollout/response_length_correct"] = masked.masked_mean(lengths, valid & solved)
    m["rollout/response_length_incorrect"] = masked.masked_mean(lengths, valid & ~solved)
  m["rollout/response_length_mean"] = jnp.mean(lengths) if b else jnp.float32(0)
  m["rollout/response_length_max"] = jnp.max(lengths, initial=0.0)
  if truncated is None and max_new_tokens is not None:
    truncated = lengths >= max_new_tokens
  if truncated is not None:
    m["rollout/truncation_rate"] = jnp.mean(_f32(jnp.asarray(truncated, bool))) if b else jnp.float32(0)
  m["rollout/invalid_frac"] = jnp.mean(_f32(~valid)) if b else jnp.float32(0)
  m["rollout/completion_tokens"] = _f32(jnp.sum(mask))

  # Groups: zero-variance groups (all valid rewards equal, or < 2 valid) carry no group-relative signal.
  g = b // group_size
  zero_var = advantages.group_zero_variance(scores, group_size, valid)  # [g]
  m["groups/zero_variance_frac"] = jnp.mean(_f32(zero_var)) if g else jnp.float32(0)
  if success is not None:
    gv = valid.reshape(g, group_size)
    gsucc = jnp.asarray(success, bool).reshape(g, group_size) & gv
    any_valid = jnp.any(gv, axis=1)
    n_succ, n_valid = jnp.sum(gsucc, axis=1), jnp.sum(gv, axis=1)
    m["groups/solve_all_frac"] = jnp.mean(_f32(any_valid & (n_succ == n_valid))) if g else jnp.float32(0)
    m["groups/solve_none_frac"] = jnp.mean(_f32(any_valid & (n_succ == 0))) if g else jnp.float32(0)

  # Policy vs reference.
  policy_logp = logprobs if logprobs is not None else sampler_logprobs
  if policy_logp is not None and ref_logprobs is not None:
    k1 = kl.estimate(policy_logp, ref_logprobs, "k1", mask)  # [B, T]
    m["policy/kl_ref_k1"] = masked.masked_mean(k1, mask)
    m["policy/kl_ref_k3"] = masked.masked_mean(kl.estimate(policy_logp, ref_logprobs, "k3", mask), mask)
    m["policy/kl_ref_seq"] = jnp.mean(jnp.sum(k1, axis=-1)) if b else jnp.float32(0)  # k1 summed per completion
  if entropy is not None:
    m["policy/entropy"] = masked.masked_mean(_f32(entropy), mask)

  # Sampler vs trainer: the tokens come from the sampler, so KL(sampler || trainer) has the sampler as "pi";
  # the per-token gap |trainer - sampler| is |k1|.
  if logprobs is not None and sampler_logprobs is not None:
    gap = jnp.abs(kl.estimate(sampler_logprobs, logprobs, "k1", mask))  # [B, T]
    m["offpolicy/logprob_gap_mean_abs"] = masked.masked_mean(gap, mask)
    m["offpolicy/logprob_gap_max"] = masked.masked_max(gap, mask)
    m["offpolicy/sampler_trainer_kl"] = masked.masked_mean(kl.estimate(sampler_logprobs, logprobs, "k3", mask), mask)
  if is_weights is not None:
    w = _f32(is_weights)
    m["offpolicy/is_weight_mean"] = masked.masked_mean(w, mask)
    m["offpolicy/is_weight_max"] = masked.masked_max(w, mask)

  # Value model.
  if values is not None and returns is not None:
    ret, val = _f32(returns), _f32(values)
    var_ret = masked.masked_var(ret, mask)
    var_err = masked.masked_var(ret - val, mask)
    m["value/explained_variance"] = jnp.where(var_ret > 1e-8, 1.0 - var_err / jnp.maximum(var_ret, 1e-8), 0.0)

  return {k: jnp.asarray(v, jnp.float32) for k, v in m.items()}


# ---------------------------------------------------------------------------------------------- performance


def perf_metrics(timings: Mapping[str, float], n_tokens: int) -> dict[str, float]:
  """Throughput and time split of one step.

  Args:
    timings: seconds per phase, e.g. {"sampling": 3.1, "scoring": 0.4, "update": 2.2}; an optional
      "total" is the step's wall time (default: the sum of the phases).
    n_tokens: tokens processed in the step (e.g. completion tokens).

  Returns:
    "perf/tokens_per_s", "perf/time_total_s", and per phase "perf/time_{phase}_s" and "perf/frac_{phase}"
    (its share of the total; 0 when the total is 0).
  """
  phases = {k: float(v) for k, v in timings.items() if k != "total"}
  total = float(timings["total"]) if "total" in timings else sum(phases.values())
  out = {"perf/tokens_per_s": n_tokens / total if total > 0 else 0.0, "perf/time_total_s": total}
  for name, t in phases.items():
    out[f"perf/time_{name}_s"] = t
    out[f"perf/frac_{name}"] = t / total if total > 0 else 0.0
  return out


@contextlib.contextmanager
def timed(timings: dict[str, float], name: str, clock: Callable[[], float] = time.perf_counter) -> Iterator[None]:
  """Adds the wall time of the block to `timings[name]`. JAX dispatch is asynchronous: block on the
  block's outputs (`jax.block_until_ready`) inside it, or the time lands in a later phase."""
  start = clock()
  try:
    yield
  finally:
    timings[name] = timings.get(name, 0.0) + (clock() - start)


# ---------------------------------------------------------------------------------------------- alarms


def check_alarms(metrics: Mapping[str, Any], cfg: AlarmConfig | None = None) -> list[str]:
  """The alarm lines of one step's metrics, without patience: `rl_lm.health.check` (the rules live there; the
  RL loop uses `rl_lm.health.Monitor`, which also keeps notes and waits `patience` steps)."""
  from rl_lm import health

  return health.check(metrics, cfg)


__all__ = ["AlarmConfig", "check_alarms", "perf_metrics", "rollout_metrics", "timed"]
