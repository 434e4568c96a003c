"""Run-health metrics on a tiny hand-built batch, guards against empty masks, perf metrics, alarms."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_lm import diagnostics
from rl_lm.diagnostics import AlarmConfig, check_alarms, perf_metrics, rollout_metrics

LN2 = math.log(2.0)
NAN = float("nan")

# B = 6 episodes in 3 groups of 2, T = 3 tokens.
#   group 0 (rows 0, 1): scores 1, 0 -> signal
#   group 1 (rows 2, 3): scores 1, 1 -> zero variance
#   group 2 (rows 4, 5): row 5 invalid -> one valid member -> zero variance
MASK = np.array([
  [1, 1, 0],
  [1, 1, 1],
  [0, 0, 0],  # fully masked row (empty completion)
  [1, 0, 0],
  [1, 1, 1],
  [1, 0, 0],
], bool)


def _token_array(on_mask: dict, default: float, off_mask: float = NAN) -> np.ndarray:
  """[6, 3] float array: `default` on the mask, `off_mask` (garbage) elsewhere, overrides from `on_mask`."""
  a = np.where(MASK, default, off_mask).astype(np.float32)
  for (i, j), v in on_mask.items():
    assert MASK[i, j]
    a[i, j] = v
  return a


def _batch(**overrides):
  logp = _token_array({}, -1.0, off_mask=1e4)  # huge off-mask values must not overflow exp()
  d = {(0, 0): LN2, (1, 2): -LN2, (4, 1): 0.5}  # ref - logp on three tokens, 0 elsewhere
  ref = logp + _token_array(d, 0.0, off_mask=1e4)  # off-mask exp(ref - logp) would be inf
  log_r = {(0, 1): 0.1, (4, 2): -0.3}  # trainer - sampler
  sampler = logp - _token_array(log_r, 0.0, off_mask=1e4)
  returns = np.full((6, 3), 1e6, np.float32)
  returns[MASK] = np.arange(10)
  err = np.zeros((6, 3), np.float32)
  err[MASK] = np.array([1, -1] * 5)
  values = np.where(MASK, returns + err, 123.0).astype(np.float32)
  batch = dict(
    scores=np.array([1, 0, 1, 1, 0, 1], np.float32),
    valid=np.array([1, 1, 1, 1, 1, 0], bool),
    success=np.array([1, 0, 1, 1, 0, 0], bool),
    completion_mask=MASK,
    group_size=2,
    max_new_tokens=3,
    logprobs=logp,
    sampler_logprobs=sampler,
    ref_logprobs=ref,
    entropy=_token_array({(3, 0): 1.5}, 0.5),
    values=values,
    returns=returns,
    is_weights=_token_array({(1, 0): 3.0}, 1.0, off_mask=100.0),
  )
  batch.update(overrides)
  return batch


def _expected():
  return {
    "rollout/reward_mean": 0.6,
    "rollout/reward_std": math.sqrt(0.24),
    "rollout/pass_rate": 0.6,
    "rollout/response_length_mean": 10 / 6,
    "rollout/response_length_max": 3.0,
    "rollout/response_length_correct": 1.0,  # valid and solved: rows 0, 2, 3 (lengths 2, 0, 1)
    "rollout/response_length_incorrect": 3.0,  # valid and not solved: rows 1, 4 (row 5 is invalid)
    "rollout/truncation_rate": 2 / 6,
    "rollout/invalid_frac": 1 / 6,
    "rollout/completion_tokens": 10.0,
    "groups/zero_variance_frac": 2 / 3,
    "groups/solve_all_frac": 1 / 3,
    "groups/solve_none_frac": 1 / 3,
    "policy/kl_ref_k1": -0.5 / 10,
    "policy/kl_ref_k3": ((1 - LN2) + (LN2 - 0.5) + (math.exp(0.5) - 1.5)) / 10,
    "policy/kl_ref_seq": (-LN2 + LN2 - 0.5) / 6,  # per-completion sums of k1 = logp - ref, mean over 6 rows
    "policy/entropy": 0.6,
    "offpolicy/logprob_gap_mean_abs": 0.04,
    "offpolicy/logprob_gap_max": 0.3,
    "offpolicy/sampler_trainer_kl": ((math.exp(0.1) - 1.1) + (math.exp(-0.3) - 0.7)) / 10,
    "offpolicy/is_weight_mean": 1.2,
    "offpolicy/is_weight_max": 3.0,
    "value/explained_variance": 1 - 1 / 8.25,
  }


def _check(got, want):
  assert set(got) == set(want)
  for k, v in want.items():
    assert float(got[k]) == pytest.approx(v, abs=1e-5), k


def test_hand_computed_metrics():
  _check(rollout_metrics(**_batch()), _expected())


def test_jit_matches_eager():
  fn = jax.jit(rollout_metrics, static_argnames=("group_size", "max_new_tokens"))
  got = fn(**{k: (jnp.asarray(v) if isinstance(v, np.ndarray) else v) for k, v in _batch().items()})
  _check(got, _expected())


def test_explicit_truncated_and_lengths():
  m = rollout_metrics(**_batch(truncated=np.array([0, 0, 0, 0, 0, 1], bool), lengths=np.array([2, 3, 0, 1, 3, 9])))
  assert float(m["rollout/truncation_rate"]) == pytest.approx(1 / 6)
  assert float(m["rollout/response_length_max"]) == 9.0


def test_optional_inputs_drop_their_keys():
  b = _batch()
  m = rollout_metrics(scores=b["scores"], valid=b["valid"], completion_mask=MASK, group_size=3)
  assert set(m) == {"rollout/reward_mean", "rollout/reward_std", "rollout/response_length_mean",
                    "rollout/response_length_max", "rollout/invalid_frac", "rollout/completion_tokens",
                    "groups/zero_variance_frac"}
  # Groups of 3: (1, 0, 1) has signal, (1, 0, [1 invalid]) has signal too.
  assert float(m["groups/zero_variance_frac"]) == 0.0
  # KL falls back to the sampler's log-probs when no trainer log-probs are given.
  m = rollout_metrics(scores=b["scores"], valid=b["valid"], completion_mask=MASK, group_size=2,
                      sampler_logprobs=b["logprobs"], ref_logprobs=b["ref_logprobs"])
  assert float(m["policy/kl_ref_k1"]) == pytest.approx(-0.05, abs=1e-6)
  assert "offpolicy/logprob_gap_mean_abs" not in m


def test_all_masked_and_all_invalid_batch_gives_zeros_not_nan():
  b = _batch(completion_mask=np.zeros((6, 3), bool), valid=np.zeros(6, bool))
  m = rollout_metrics(**b)
  assert set(m) == set(_expected())
  for k, v in m.items():
    assert np.isfinite(float(v)), k
  for k in ("rollout/reward_mean", "rollout/reward_std", "rollout/pass_rate", "policy/kl_ref_k3", "policy/entropy",
            "offpolicy/logprob_gap_max", "offpolicy/sampler_trainer_kl", "offpolicy/is_weight_max",
            "value/explained_variance", "rollout/completion_tokens", "groups/solve_all_frac"):
    assert float(m[k]) == 0.0, k
  assert float(m["rollout/invalid_frac"]) == 1.0
  assert float(m["groups/zero_variance_frac"]) == 1.0


def test_constant_returns_give_zero_explained_variance():
  m = rollout_metrics(**_batch(returns=np.full((6, 3), 2.0, np.float32)))
  assert float(m["value/explained_variance"]) == 0.0


def test_all_groups_with_signal_and_equal_groups():
  ones = np.ones(4, bool)
  m = rollout_metrics(scores=np.array([0.0, 1.0, 0.3, 0.3]), valid=ones, completion_mask=np.ones((4, 2), bool),
                      group_size=2, success=np.array([0, 1, 0, 0], bool))
  assert float(m["groups/zero_variance_frac"]) == 0.5
  assert float(m["groups/solve_none_frac"]) == 0.5 and float(m["groups/solve_all_frac"]) == 0.0


def test_batch_not_multiple_of_group_size_raises():
  with pytest.raises(ValueError, match="group_size"):
    rollout_metrics(scores=np.zeros(5), valid=np.ones(5, bool), completion_mask=np.ones((5, 2), bool), group_size=2)


def test_perf_metrics():
  m = perf_metrics({"sampling": 3.0, "scoring": 1.0, "update": 4.0}, n_tokens=800)
  assert m["perf/tokens_per_s"] == 100.0 and m["perf/time_total_s"] == 8.0
  assert m["perf/time_sampling_s"] == 3.0 and m["perf/frac_sampling"] == 0.375
  assert m["perf/frac_update"] == 0.5 and m["perf/frac_scoring"] == 0.125
  m = perf_metrics({"sampling": 3.0, "total": 10.0}, n_tokens=50)
  assert m["perf/tokens_per_s"] == 5.0 and m["perf/frac_sampling"] == 0.3
  m = perf_metrics({}, n_tokens=10)
  assert m == {"perf/tokens_per_s": 0.0, "perf/time_total_s": 0.0}


def test_timed_accumulates():
  ticks = iter([1.0, 3.5, 10.0, 11.0])
  timings = {}
  with diagnostics.timed(timings, "sampling", clock=lambda: next(ticks)):
    pass
  with diagnostics.timed(timings, "sampling", clock=lambda: next(ticks)):
    pass
  assert timings == {"sampling": 3.5}


def test_healthy_metrics_raise_no_alarm():
  assert check_alarms(rollout_metrics(**_batch()), AlarmConfig(invalid_frac_max=0.2, truncation_max=0.5)) == []
  assert check_alarms({}) == []


def test_alarms_fire_with_names_values_and_thresholds():
  metrics = {
    "policy/entropy": jnp.float32(0.012),
    "policy/kl_ref_k1": np.float32(0.9),
    "offpolicy/logprob_gap_mean_abs": 0.2,
    "groups/zero_variance_frac": 0.95,
    "rollout/invalid_frac": 0.5,
    "rollout/reward_mean": 0.3,
  }
  alarms = check_alarms(metrics, AlarmConfig(entropy_min=0.05, kl_max=0.5, logprob_gap_max=0.05))
  assert "ALARM policy/entropy=0.012 < 0.05: entropy collapsed" in alarms
  assert "ALARM policy/kl_ref_k1=0.9 > 0.5: policy drifted far from the reference" in alarms
  assert any(a.startswith("ALARM offpolicy/logprob_gap_mean_abs=0.2 > 0.05") for a in alarms)
  assert not any("zero_variance" in a for a in alarms)  # a note (rl_lm.health), not an alarm
  assert any(a.startswith("ALARM rollout/invalid_frac=0.5 > 0.1") and "verifier errors" in a for a in alarms)
  assert len(alarms) == 4
  # Thresholds are configurable; 0 (a minimum), 1 (a maximum fraction) or inf (another maximum) disables an alarm.
  assert check_alarms(metrics, AlarmConfig(entropy_min=0.0, kl_max=math.inf, logprob_gap_max=math.inf,
                                           zero_variance_max=1.0, invalid_frac_max=1.0)) == []
  assert check_alarms({"rollout/truncation_rate": 0.7}, AlarmConfig(truncation_max=0.5)) == [
    "ALARM rollout/truncation_rate=0.7 > 0.5: completions keep hitting max_new_tokens"]
  # Rows sampled ahead: their sampler/trainer gap is the policy's change, not a disagreement; the rest still fire.
  stale = check_alarms({**metrics, "offpolicy/staleness_max": 1.0},
                       AlarmConfig(entropy_min=0.05, kl_max=0.5, logprob_gap_max=0.05))
  assert len(stale) == 3 and not any("logprob_gap" in a for a in stale)


def test_non_finite_alarm():
  alarms = check_alarms({"train/loss": jnp.float32(jnp.nan), "train/grad_norm": float("inf"), "note": "text",
                         "policy/entropy": float("nan")})
  assert "ALARM train/loss=nan: non-finite value" in alarms
  assert "ALARM train/grad_norm=inf: non-finite value" in alarms
  assert "ALARM policy/entropy=nan: non-finite value" in alarms
  assert len(alarms) == 3  # the NaN entropy is not also reported as "collapsed"; strings are ignored
  assert check_alarms({"train/loss": float("nan")}, AlarmConfig(check_finite=False)) == []
