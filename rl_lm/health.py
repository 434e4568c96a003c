"""Run health: alarms (the run is likely failing) and notes (worth knowing, not alarming), from each step's metrics.

  monitor = health.Monitor(AlarmConfig())
  for step ...:
    for line in monitor.update(step, metrics):   # "ALARM step 12: policy/kl_ref_k1=1.31 > 1 (3 steps): ..."
      print(line)
  monitor.summary()   # {"alarms": [...], "notes": [...]}: what fired, first and last step, worst value, meaning

A rule reports when its condition has held for `patience` consecutive logged steps (one noisy batch is not a
trend), once, at that step; it reports again only after it has cleared. A non-finite metric is an alarm at once.
The thresholds and the split between alarms and notes were chosen on a labelled set of healthy and deliberately
broken runs (experiments/alarms: its README has each rule's precision, recall and lead time, and how the
thresholds were picked). `check(metrics)` is the stateless view: the rules that hold on one step's metrics.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rl_lm.config import AlarmConfig

Metrics = Mapping[str, Any]


def scalar(v: Any) -> float | None:
  """A float from a Python / numpy / jax scalar; None for anything else (strings, arrays of size > 1)."""
  if isinstance(v, bool | int | float | np.number):
    return float(v)
  try:
    a = np.asarray(v)
  except Exception:  # noqa: BLE001
    return None
  if a.size != 1 or not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
    return None
  return float(a.reshape(()))


def _get(m: Mapping[str, float], key: str, default: float = math.nan) -> float:
  v = m.get(key)
  return default if v is None else v


@dataclasses.dataclass(frozen=True)
class Rule:
  """One condition on a step's metrics.

  Attributes:
    name: short id (the key of its summary record).
    kind: "alarm" or "note".
    key: the metric compared with the threshold.
    field: the AlarmConfig field that holds the threshold.
    op: "<" (holds below the threshold), "<=", or ">" (above).
    meaning: the one-line reading in the log.
    usually: what it usually means in practice and what to look at (the run-health summary).
    when: an extra condition on the same step's metrics (floats), e.g. "no importance weights".
    patience: steps the condition must hold before it is reported; None: AlarmConfig.patience.
  """

  name: str
  kind: str
  key: str
  field: str
  op: str
  meaning: str
  usually: str
  when: Callable[[Mapping[str, float]], bool] | None = None
  patience: int | None = None

  def holds(self, m: Mapping[str, float], cfg: AlarmConfig, stale: bool) -> bool:
    v, threshold = m.get(self.key), getattr(cfg, self.field)
    if v is None or not math.isfinite(v) or (stale and self.key in _NUMERICS):
      return False
    hit = {"<": v < threshold, "<=": v <= threshold, ">": v > threshold}[self.op]
    return hit and (self.when is None or self.when(m))


def _corrected(m: Mapping[str, float]) -> bool:
  return "offpolicy/is_weight_max" in m  # the update applies importance weights to the sampler's tokens


# Sampler/trainer agreement: meaningful when both score the same parameters (no row sampled ahead).
_NUMERICS = ("offpolicy/logprob_gap_mean_abs", "offpolicy/sampler_trainer_kl")

RULES = (
  Rule("entropy", "alarm", "policy/entropy", "entropy_min", "<", "entropy collapsed",
       "the policy samples nearly one completion per prompt: exploration has stopped and pass@k at large k "
       "falls; raise the sampling temperature, add an entropy bonus or clip-higher"),
  Rule("kl_ref", "alarm", "policy/kl_ref_k1", "kl_max", ">", "policy drifted far from the reference",
       "the updates are too large (learning rate, clipping) or nothing holds the policy back (KL coefficient 0); "
       "against a learned reward this is over-optimisation: the proxy rises while the true reward falls"),
  Rule("grad_norm", "alarm", "train/grad_norm", "grad_norm_max", ">", "gradients blew up",
       "the gradient before clipping is far above its usual size: a learning rate too high or log-probs the "
       "trainer finds very unlikely (a sampler/trainer mismatch); a collapse usually follows",
       patience=1),  # one step at several times the healthy maximum is news at once
  Rule("logprob_gap", "alarm", "offpolicy/logprob_gap_mean_abs", "logprob_gap_max", ">",
       "sampler and trainer log-probs disagree, nothing corrects it",
       "the sampler's numerics differ from the trainer's (bfloat16 sampling, another kernel) and the update "
       "uses no importance weights: the gradient is off-policy and biased; turn on rl.correction",
       when=lambda m: not _corrected(m)),
  Rule("logprob_gap_corrected", "note", "offpolicy/logprob_gap_mean_abs", "logprob_gap_max", ">",
       "sampler and trainer log-probs disagree; the importance weights correct it",
       "expected with a bfloat16 sampler; watch offpolicy/is_truncated_frac", when=_corrected),
  Rule("sampler_trainer_kl", "alarm", "offpolicy/sampler_trainer_kl", "sampler_trainer_kl_max", ">",
       "sampler and trainer distributions disagree", "as logprob_gap"),
  Rule("constant_reward", "alarm", "rollout/reward_std", "reward_std_min", "<=",
       "every reward in the batch is the same",
       "no episode scores differently from another, so there is nothing to learn: a broken verifier, a reward "
       "weight of 0, or a task wholly out of reach",
       when=lambda m: _get(m, "rollout/pass_rate", 0.0) < 1.0),
  Rule("zero_variance", "note", "groups/zero_variance_frac", "zero_variance_max", ">",
       "most groups carry no learning signal",
       "groups all solved: the curriculum should move on to harder prompts; groups all failed: the prompts are "
       "too hard for the policy (groups/solve_all_frac and groups/solve_none_frac say which)"),
  Rule("invalid", "alarm", "rollout/invalid_frac", "invalid_frac_max", ">", "too many verifier errors",
       "the verifier or its sandbox is failing (masked episodes, not the policy's doing): check the reward's "
       "statuses in the rollout samples"),
  Rule("teacher_invalid", "alarm", "distill/teacher_invalid_frac", "invalid_frac_max", ">",
       "the teacher scores too many rows non-finitely",
       "the distillation teacher's log-probs are nan or inf on these rows (masked, not the policy's doing): a "
       "corrupt checkpoint or a dtype overflow; check config.teacher.param_dtype"),
  Rule("truncation", "alarm", "rollout/truncation_rate", "truncation_max", ">",
       "completions keep hitting max_new_tokens",
       "responses are growing to the budget: a reward that pays for length, or long wrong answers kept in the "
       "gradient; check rl.overlong and the reward"),
  Rule("is_weight", "alarm", "offpolicy/is_weight_max", "is_weight_max", ">", "importance weights exploded",
       "stale or mismatched rows far off-policy; lower rl.max_staleness or the cap"),
  Rule("env_failure", "alarm", "episodes/failure_env", "env_failure_max", ">",
       "environments keep failing (masked episodes, not the policy)",
       "worker crashes or timeouts; see episodes/failure_* and the worker pool's logs"),
)


def _floats(metrics: Metrics) -> dict[str, float]:
  out = {}
  for k, v in metrics.items():
    f = scalar(v)
    if f is not None:
      out[k] = f
  return out


def _line(rule: Rule, m: Mapping[str, float], cfg: AlarmConfig) -> str:
  return f"{rule.key}={m[rule.key]:.4g} {rule.op} {getattr(cfg, rule.field):g}: {rule.meaning}"


def check(metrics: Metrics, cfg: AlarmConfig | None = None, kinds: tuple[str, ...] = ("alarm",)) -> list[str]:
  """The rules of `kinds` that hold on one step's metrics, as "ALARM <key>=<v> <op> <threshold>: <meaning>"
  lines (and "NOTE ..."), non-finite metrics first ("ALARM <key>=nan: non-finite value"). Missing metrics are
  skipped. A threshold of 0 (a minimum), 1 (a maximum fraction) or inf (another maximum) turns its rule off. The
  sampler/trainer agreement rules are off for a batch with rows sampled ahead (`offpolicy/staleness_max` > 0):
  there the gap is the policy's change over those updates, which the importance weights correct."""
  cfg = cfg or AlarmConfig()
  m = _floats(metrics)
  lines = []
  if cfg.check_finite and "alarm" in kinds:
    lines += [f"ALARM {k}={v}: non-finite value" for k, v in sorted(m.items()) if not math.isfinite(v)]
  stale = _get(m, "offpolicy/staleness_max", 0.0) > 0
  lines += [f"{r.kind.upper()} {_line(r, m, cfg)}" for r in RULES if r.kind in kinds and r.holds(m, cfg, stale)]
  return lines


class Monitor:
  """Applies the rules step by step with patience and keeps the record the run-health summary is made of."""

  def __init__(self, cfg: AlarmConfig | None = None) -> None:
    self.cfg = cfg or AlarmConfig()
    self._streak: dict[str, int] = {}  # rule name -> consecutive steps it held
    self._active: set[str] = set()  # rules reported and not cleared since
    self.records: dict[str, dict[str, Any]] = {}  # rule name -> what the summary says about it

  def update(self, step: int, metrics: Metrics, rules: bool = True) -> list[str]:
    """The lines to print for this step: rules that just reached `patience` steps, and non-finite metrics.
    `rules` False: the non-finite check alone, the rules' streaks left as they were (a step whose rollout is not
    the policy's: on-policy distillation's steps on the teacher's samples)."""
    m, cfg = _floats(metrics), self.cfg
    lines = []
    if cfg.check_finite:
      bad = sorted(k for k, v in m.items() if not math.isfinite(v))
      if bad:
        lines.append(f"ALARM step {step}: non-finite {', '.join(bad)}")
        self._record("non_finite", "alarm", step, ", ".join(bad), math.nan, "non-finite metrics",
                     "a NaN or inf in the loss or the gradients: the update diverged or a reward is broken", 1)
    stale = _get(m, "offpolicy/staleness_max", 0.0) > 0
    for r in RULES if rules else ():
      if not r.holds(m, cfg, stale):
        self._streak[r.name] = 0
        self._active.discard(r.name)
        continue
      self._streak[r.name] = n = self._streak.get(r.name, 0) + 1
      patience = cfg.patience if r.patience is None else r.patience
      if n < patience:
        continue
      rec = self._record(r.name, r.kind, step, r.key, m[r.key], r.meaning, r.usually, n if n == patience else 1)
      rec["worst"] = m[r.key] if math.isnan(rec["worst"]) else (
        min(rec["worst"], m[r.key]) if r.op.startswith("<") else max(rec["worst"], m[r.key]))
      if r.name not in self._active:
        self._active.add(r.name)
        lines.append(f"{r.kind.upper()} step {step}: {_line(r, m, cfg)} ({n} step{'s' if n > 1 else ''})")
    return lines

  def _record(self, name: str, kind: str, step: int, key: str, value: float, meaning: str, usually: str,
              steps: int) -> dict[str, Any]:
    rec = self.records.setdefault(name, {"kind": kind, "key": key, "first_step": step, "last_step": step,
                                         "steps": 0, "episodes": 0, "worst": value, "meaning": meaning,
                                         "usually": usually})
    if name not in self._active:
      rec["episodes"] += 1  # separate spells of the condition
    rec["last_step"], rec["steps"] = step, rec["steps"] + steps
    return rec

  def summary(self) -> dict[str, Any]:
    """{"alarms": [...], "notes": [...], "patience": n}: each record with its rule's name, in firing order."""
    ordered = sorted(self.records.items(), key=lambda kv: kv[1]["first_step"])
    out: dict[str, Any] = {"alarms": [], "notes": [], "patience": self.cfg.patience}
    for name, rec in ordered:
      out["alarms" if rec["kind"] == "alarm" else "notes"].append({"rule": name, **rec})
    return out

  def summary_lines(self) -> list[str]:
    """The run-health summary for the console."""
    s = self.summary()
    if not s["alarms"] and not s["notes"]:
      return ["run health: no alarm, no note"]
    lines = [f"run health: {len(s['alarms'])} alarm(s), {len(s['notes'])} note(s)"]
    for rec in s["alarms"] + s["notes"]:
      worst = "" if math.isnan(rec["worst"]) else f", worst {rec['worst']:.4g}"
      lines.append(f"  {rec['kind'].upper()} {rec['key']}: steps {rec['first_step']}-{rec['last_step']} "
                   f"({rec['steps']} steps{worst}): {rec['meaning']}. Usually: {rec['usually']}")
    return lines

  def state_dict(self) -> dict[str, Any]:
    return {"streak": dict(self._streak), "active": sorted(self._active), "records": self.records}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    self._streak = {k: int(v) for k, v in state.get("streak", {}).items()}
    self._active = set(state.get("active", ()))
    self.records = {k: dict(v) for k, v in state.get("records", {}).items()}


__all__ = ["RULES", "Monitor", "Rule", "check", "scalar"]
