"""The alarms measured on the labelled run set: precision, recall and lead time of each rule.

A run has *failed* at the first step where its held-out metric leaves the band its family's healthy runs occupy
at the same step, by more than MARGIN: held-out pass@1 (evaluated every few steps) for the arithmetic runs, the
gold reward of each step's rollouts (a trailing mean over GOLD_WINDOW steps) for the RLHF runs. The band is the
lowest healthy value at that step. An alarm's *lead time* is the failure step minus the step the alarm was
printed (positive: the alarm came first). Precision and recall are per run: an alarm that fired anywhere in a
healthy run is a false positive.

Each rule's *healthy extreme* is the worst value it held for `patience` consecutive steps in any healthy run
(the largest of the window minima for a maximum, the smallest window maximum for a minimum): a threshold
beyond it cannot fire on those runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments.alarms import runs as run_defs
from rl_lm import health
from rl_lm.config import AlarmConfig

MARGIN = 0.05  # how far below the healthy band a run must fall to have failed (pass@1 or gold)
GOLD_WINDOW = 5


@dataclasses.dataclass
class RunData:
  run: run_defs.Run
  steps: list[dict[str, float]]  # the RL steps' metrics, in order
  evals: dict[int, float]  # step -> held-out pass@1


def load(workdir: Path, run: run_defs.Run) -> RunData | None:
  path = workdir / run.name / "metrics.jsonl"
  if not path.exists():
    return None
  rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  steps = [r for r in rows if "policy/entropy" in r or "rollout/reward_mean" in r]
  evals = {int(r["step"]): float(r["eval/pass@1"]) for r in rows if "eval/pass@1" in r}
  return RunData(run, steps, evals)


def signal(d: RunData) -> dict[int, float]:
  """The held-out metric the failure is read from, by step."""
  if d.run.family == "rlhf":
    gold = [float(r.get("rollout/gold_mean", math.nan)) for r in d.steps]
    return {int(r["step"]): float(np.nanmean(gold[max(0, i - GOLD_WINDOW + 1): i + 1]))
            for i, r in enumerate(d.steps)}
  return d.evals


def failure_step(d: RunData, healthy: Sequence[RunData]) -> int | None:
  """The first step where `d` is below the healthy band by more than MARGIN; None if never."""
  peers = [signal(h) for h in healthy if h.run.family == d.run.family]
  for step, v in sorted(signal(d).items()):
    band = [p[step] for p in peers if step in p]
    if step > 0 and band and v < min(band) - MARGIN:
      return step
  return None


def replay(d: RunData, cfg: AlarmConfig) -> dict[str, Any]:
  """The monitor over the run's steps: {rule: first step printed} for alarms and notes, and the summary."""
  monitor = health.Monitor(cfg)
  for r in d.steps:
    monitor.update(int(r["step"]), r)
  s = monitor.summary()
  return {"alarms": {a["rule"]: a["first_step"] for a in s["alarms"]},
          "notes": {n["rule"]: n["first_step"] for n in s["notes"]}}


def held_extreme(values: np.ndarray, op: str, patience: int) -> float:
  """The worst value held for `patience` consecutive steps (nan when too few)."""
  if len(values) < patience:
    return math.nan
  win = np.lib.stride_tricks.sliding_window_view(values, patience)
  return float(np.max(np.min(win, 1))) if op == ">" else float(np.min(np.max(win, 1)))


def rule_values(d: RunData, rule: health.Rule) -> np.ndarray:
  """The rule's metric over the steps where its extra condition holds (nan elsewhere)."""
  out = []
  for r in d.steps:
    m = {k: float(v) for k, v in r.items() if isinstance(v, int | float)}
    ok = rule.key in m and (rule.when is None or rule.when(m))
    out.append(m[rule.key] if ok else math.nan)
  return np.asarray(out, float)


def calibrate(workdir: Path, cfg: AlarmConfig | None = None) -> dict[str, Any]:
  cfg = cfg or AlarmConfig()
  data = [d for d in (load(workdir, r) for r in run_defs.run_set()) if d is not None]
  healthy = [d for d in data if d.run.healthy]
  failures = [d for d in data if not d.run.healthy]
  runs = []
  for d in data:
    fired = replay(d, cfg)
    fail = None if d.run.healthy else failure_step(d, healthy)
    first = min(fired["alarms"].items(), key=lambda kv: kv[1]) if fired["alarms"] else None
    runs.append({"name": d.run.name, "healthy": d.run.healthy, "cause": d.run.cause, "alarms": fired["alarms"],
                 "notes": fired["notes"], "failure_step": fail, "first_alarm": first,
                 "lead": (fail - first[1]) if (fail is not None and first) else None, "steps": len(d.steps)})
  rules = []
  for rule in health.RULES:
    if rule.kind != "alarm":
      continue
    tp = sum(1 for r in runs if not r["healthy"] and rule.name in r["alarms"])
    fp = sum(1 for r in runs if r["healthy"] and rule.name in r["alarms"])
    patience = cfg.patience if rule.patience is None else rule.patience
    ext = [held_extreme(v[~np.isnan(v)], rule.op[0], patience) for v in (rule_values(d, rule) for d in healthy)]
    ext = [e for e in ext if not math.isnan(e)]
    leads = [r["failure_step"] - r["alarms"][rule.name] for r in runs
             if not r["healthy"] and rule.name in r["alarms"] and r["failure_step"] is not None]
    rules.append({"rule": rule.name, "key": rule.key, "op": rule.op, "threshold": getattr(cfg, rule.field),
                  "healthy_extreme": (max(ext) if rule.op == ">" else min(ext)) if ext else None,
                  "flagged": tp, "false_positives": fp, "precision": tp / (tp + fp) if tp + fp else None,
                  "recall": tp / len(failures) if failures else None, "leads": leads})
  return {"runs": runs, "rules": rules, "patience": cfg.patience, "margin": MARGIN}


def _fmt(v: Any, spec: str = ".3g") -> str:
  return "–" if v is None else format(v, spec) if isinstance(v, float) else str(v)


def markdown(result: dict[str, Any]) -> str:
  lines = ["| run | label | alarms (first step) | notes (first step) | failure shows at | lead (steps) |",
           "| --- | --- | --- | --- | --- | --- |"]
  for r in result["runs"]:
    alarms = ", ".join(f"{k} ({v})" for k, v in sorted(r["alarms"].items(), key=lambda kv: kv[1])) or "none"
    notes = ", ".join(f"{k} ({v})" for k, v in sorted(r["notes"].items(), key=lambda kv: kv[1])) or "none"
    label = "healthy" if r["healthy"] else "failure"
    fail = "–" if r["healthy"] else ("never (within the band)" if r["failure_step"] is None else r["failure_step"])
    lines.append(f"| {r['name']} | {label} | {alarms} | {notes} | {fail} | {_fmt(r['lead'])} |")
  lines += ["", "| alarm | metric | threshold | healthy extreme | failures flagged | false positives | precision | "
                "recall | lead times |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for r in result["rules"]:
    lines.append(f"| {r['rule']} | `{r['key']}` {r['op']} | {r['threshold']:g} | {_fmt(r['healthy_extreme'])} | "
                 f"{r['flagged']} | {r['false_positives']} | {_fmt(r['precision'], '.2f')} | "
                 f"{_fmt(r['recall'], '.2f')} | {', '.join(map(str, r['leads'])) or '–'} |")
  n_fail = sum(1 for r in result["runs"] if not r["healthy"])
  flagged = sum(1 for r in result["runs"] if not r["healthy"] and r["alarms"])
  false = sum(1 for r in result["runs"] if r["healthy"] and r["alarms"])
  lines += ["", f"Any alarm: {flagged}/{n_fail} failures flagged, {false} healthy runs with an alarm "
                f"(patience {result['patience']} steps, failure margin {result['margin']})."]
  return "\n".join(lines)


def write(result: dict[str, Any], out: Path) -> str:
  out.mkdir(parents=True, exist_ok=True)
  (out / "calibration.json").write_text(json.dumps(result, indent=1) + "\n")
  table = markdown(result)
  (out / "calibration.md").write_text(table + "\n")
  return table
