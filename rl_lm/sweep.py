"""Sweeps: run the points of a sweep on this machine, one after another or N at a time, and tabulate them.

  python -m rl_lm.sweep --config=configs/default.py --workdir=/tmp/rl_lm/sweep --parallel=2
  python -m rl_lm.sweep --config=configs/default.py:smoke --workdir=DIR --sweep_file=points.jsonl --dry_run
  python -m rl_lm.sweep --config=configs/ppo.py --workdir=DIR --sweep_file=points.json \\
      --metrics=eval/pass@1,rollout/reward_mean --config.rl.steps=40

A sweep is data: a list of points, each a dict of dotted overrides (`{"rl.learning_rate": 1e-4, "seed": 0}`),
from `sweep(arg)` beside `get_config(arg)` in the config file (`grid(...)` builds a cartesian product) or from
`--sweep_file` (a JSON list of dicts, or JSONL with one a line). Every key is checked against the config before
anything starts (exit status 2 and one line naming the point and the key). `--config.*` flags given to the sweep
apply to every point (a point's own value wins).

Each point runs `python -m rl_lm.main` (rl_lm.runs.run_main, output in log.txt) in `DIR/<name>`, the name made
from its overrides alone (`rl.learning_rate=0.0001,seed=0`; hashed when long). A point whose workdir holds
`done.json` is skipped, so re-running the command runs only what is missing; a failing point does not stop the
others. With `--parallel=N`, N pool threads each wait on one run; Ctrl-C reaches the running points too (they
stop within rl_lm.interrupts.EXIT_GRACE_S) and no new one starts.

At the end one row per point (overrides, status, wall time, final metrics, the last log line of a failed point)
goes to `DIR/sweep_results.csv`, `DIR/sweep_results.md` and the console; `DIR/sweep.png` plots the first metric
against the first swept parameter. A metric (`--metrics`) is `key` (its last value in metrics.jsonl, the RL
stage), `sft:key` (in sft_metrics.jsonl), or `after:field` / `before:field` (the evaluation after / before RL in
rl_summary.json: pass@1, greedy_accuracy, ... and its `extra` fields, e.g. tool_call_rate).
"""

from __future__ import annotations

import contextlib
import copy
import csv
import dataclasses
import hashlib
import importlib.util
import itertools
import json
import math
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from rl_lm import plots, runs

Point = dict[str, Any]  # dotted config key -> value

DEFAULT_METRICS = ("after:pass@1", "after:greedy_accuracy", "rollout/reward_mean", "policy/kl_ref_k3",
                   "sft:train/loss")
METRIC_SOURCES = ("", "sft", "after", "before")  # what comes before ':' in a metric name ("" without one)
MAX_NAME_LEN = 96


class SweepError(ValueError):
  """A sweep that cannot run as written (a bad point, an unreadable sweep file); the CLI exits with status 2."""


# ------------------------------------------------------------------------------------------------------- points


def grid(axes: Mapping[str, Sequence[Any]] | None = None, /, **more: Sequence[Any]) -> list[Point]:
  """The cartesian product of the axes, the first axis varying slowest.

  `grid({"rl.learning_rate": (1e-4, 3e-4), "seed": (0, 1)})` -> 4 points; keyword axes (`seed=(0, 1)`) are
  added after the mapping's (dotted keys need the mapping).
  """
  merged = {**dict(axes or {}), **more}
  for key, values in merged.items():
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
      raise SweepError(f"grid axis {key!r} must be a non-empty sequence of values, got {values!r}")
  return [dict(zip(merged, combo, strict=True)) for combo in itertools.product(*merged.values())]


def _plain(value: Any) -> Any:
  """numpy scalars -> Python scalars, lists -> tuples (config fields hold tuples), recursively."""
  if isinstance(value, list | tuple):
    return tuple(_plain(v) for v in value)
  if hasattr(value, "item") and not isinstance(value, str | bytes):  # numpy / jax scalar
    return value.item()
  return value


def format_value(value: Any) -> str:
  """A value as `--config.key=<this>` gives it back to ml_collections config_flags.

  Strings go raw (a str field takes the flag text as is), bools as True/False, numbers by repr (exact round
  trip), tuples as Python literals (config_flags reads them with ast.literal_eval).
  """
  value = _plain(value)
  return value if isinstance(value, str) else repr(value)


def override_flags(point: Mapping[str, Any]) -> list[str]:
  """`--config.key=value` flags for a point."""
  return [f"--config.{key}={format_value(value)}" for key, value in point.items()]


def point_name(point: Mapping[str, Any]) -> str:
  """A readable, filesystem-safe directory name made from the overrides alone.

  `{"rl.learning_rate": 1e-4, "seed": 0}` -> `rl.learning_rate=0.0001,seed=0`; characters other than
  letters, digits and `._+-` in a value become `_`; an empty point is `base`; a name longer than
  MAX_NAME_LEN is cut and ends with a hash of the whole.
  """
  if not point:
    return "base"
  parts = []
  for key, value in point.items():
    text = re.sub(r"[^A-Za-z0-9._+-]+", "_", format_value(value)).strip("_") or "_"
    parts.append(f"{re.sub(r'[^A-Za-z0-9._-]+', '_', key)}={text}")
  name = ",".join(parts)
  if len(name) > MAX_NAME_LEN:
    whole = json.dumps({k: _plain(v) for k, v in point.items()}, sort_keys=True)
    name = f"{name[:MAX_NAME_LEN - 11].rstrip(',=')}-{hashlib.sha1(whole.encode()).hexdigest()[:10]}"
  return name


def _normalise(point: Any, where: str) -> Point:
  if not isinstance(point, Mapping) or not all(isinstance(key, str) and key for key in point):
    raise SweepError(f"{where}: a point must be a dict of dotted config keys to values, got {point!r}")
  return {key.removeprefix("config."): _plain(value) for key, value in point.items()}


def load_sweep_file(path: str | os.PathLike) -> list[Point]:
  """The points of a sweep file: a JSON list of dicts, or JSONL with one dict per (non-blank) line."""
  text = Path(path).read_text()
  try:
    data = json.loads(text)
    points = data if isinstance(data, list) else [data]
  except json.JSONDecodeError:
    points = []
    for i, line in enumerate(text.splitlines(), 1):
      if not line.strip():
        continue
      try:
        points.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise SweepError(f"{path}:{i}: not JSON ({e.msg}); a sweep file is a JSON list or a dict a line") from None
  if not points:
    raise SweepError(f"{path}: no points")
  return [_normalise(p, f"{path}: point {i}") for i, p in enumerate(points, 1)]


def config_module(path: str) -> Any:
  """The module of a config file (its `get_config`, and `sweep` when it has one)."""
  spec = importlib.util.spec_from_file_location("_rl_lm_config_file", path)
  if spec is None or spec.loader is None:
    raise SweepError(f"cannot load config file {path!r}")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def points_from_config(config_spec: str) -> list[Point]:
  """The points of `sweep(arg)` (or `sweep()`) defined beside `get_config` in a `path[:arg]` config file."""
  path, _, arg = config_spec.partition(":")
  module = config_module(path)
  if not hasattr(module, "sweep"):
    raise SweepError(f"{path} defines no sweep(); add one beside get_config or pass --sweep_file")
  points = module.sweep(arg) if arg else module.sweep()
  if not points:
    raise SweepError(f"{path}: sweep({arg!r}) returned no points")
  return [_normalise(p, f"{path}: sweep() point {i}") for i, p in enumerate(points, 1)]


def check_points(config: Any, points: Sequence[Point]) -> list[str]:
  """Checks every override against a (locked) config and returns the points' names.

  Raises SweepError naming the point and the key for an unknown key, a key that names a section, a value
  the field's type refuses, or two points with the same name.
  """
  import ml_collections

  names: dict[str, int] = {}
  for i, point in enumerate(points, 1):
    name = point_name(point)
    where = f"point {i} of {len(points)} ({name})"
    probe = copy.deepcopy(config)
    for key, value in point.items():
      node, walked = probe, "config"
      for part in key.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
          known = ", ".join(sorted(node)) if isinstance(node, ml_collections.ConfigDict) else "none (not a section)"
          raise SweepError(f"{where}: config.{key}: unknown key {part!r} under {walked}; known keys: {known}")
        parent, node, walked = node, node[part], f"{walked}.{part}"
      if isinstance(node, ml_collections.ConfigDict):
        raise SweepError(f"{where}: config.{key}: names a section, not a field; override its fields one by one")
      try:
        parent[part] = value
      except (TypeError, ValueError) as e:
        raise SweepError(f"{where}: config.{key}: {str(e).splitlines()[0]}") from None
    if name in names:
      raise SweepError(f"{where}: the same directory name as point {names[name]}; points must differ")
    names[name] = i
  return list(names)


# ------------------------------------------------------------------------------------------------------ running


@dataclasses.dataclass
class Result:
  """One point of a sweep and what became of it."""

  name: str
  point: Point
  status: str = "not run"  # done | failed (exit N) | incomplete (no done.json) | not run
  wall_s: float | None = None
  note: str = ""  # the last log line of a point that did not finish
  metrics: dict[str, float | None] = dataclasses.field(default_factory=dict)


def _last_line(log: Path) -> str:
  """The last line a run wrote to its log (not a runner's header), cut to 200 characters."""
  with contextlib.suppress(OSError):
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines()
             if ln.strip() and not ln.startswith(runs.LOG_HEADER)]
    return lines[-1][:200] if lines else ""
  return ""


def run_points(config_spec: str, sweep_dir: str | os.PathLike, points: Sequence[Point], names: Sequence[str],
               common: Mapping[str, Any], parallel: int) -> list[Result]:
  """Runs the points not yet done, `parallel` at a time, printing a line per finished point."""
  from rl_lm.metrics import format_duration

  sweep_dir = Path(sweep_dir)
  results = [Result(name, dict(point)) for name, point in zip(names, points, strict=True)]
  start, finished, ran = time.monotonic(), 0, 0

  def report(result: Result, message: str) -> None:
    nonlocal finished
    finished += 1
    elapsed, left = time.monotonic() - start, len(results) - finished
    eta = elapsed / ran * left if ran else (0.0 if not left else math.nan)
    print(f"sweep: [{finished}/{len(results)}] {result.name}: {message} | elapsed {format_duration(elapsed)} | "
          f"ETA {format_duration(eta)}", flush=True)

  env = {}
  if parallel > 1 and not {"XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE"} & set(os.environ):
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{0.9 / parallel:.3f}"  # N runs sharing one GPU each take a share

  def run(result: Result) -> Result:  # in a pool thread
    workdir = sweep_dir / result.name
    code, result.wall_s = runs.run_main(config_spec, workdir, override_flags({**common, **result.point}), env)
    done = (workdir / "done.json").exists()
    result.status = f"failed (exit {code})" if code else ("done" if done else "incomplete (no done.json)")
    result.note = "" if result.status == "done" else _last_line(workdir / "log.txt")
    record = {"name": result.name, "overrides": result.point, "status": result.status, "wall_s": result.wall_s}
    (workdir / "sweep_point.json").write_text(json.dumps(record, indent=1) + "\n")
    return result

  todo = []
  for result in results:
    if not (sweep_dir / result.name / "done.json").exists():
      todo.append(result)
      continue
    result.status = "done"
    with contextlib.suppress(OSError, ValueError, KeyError):
      result.wall_s = json.loads((sweep_dir / result.name / "sweep_point.json").read_text())["wall_s"]
    report(result, "skipped (done.json)")
  with ThreadPoolExecutor(parallel) as pool:
    try:
      for future in as_completed([pool.submit(run, result) for result in todo]):
        result = future.result()
        ran += 1
        report(result, f"{result.status} in {format_duration(result.wall_s)}"
                       + (f": {result.note}" if result.note else ""))
    except KeyboardInterrupt:
      pool.shutdown(wait=False, cancel_futures=True)  # no new point starts; the running ones got the Ctrl-C too
      raise
  return results


# ------------------------------------------------------------------------------------------------------ metrics


def check_metrics(names: Sequence[str]) -> None:
  """Raises SweepError for a metric name whose source is not one of METRIC_SOURCES."""
  for name in names:
    source = name.rpartition(":")[0]
    if source not in METRIC_SOURCES:
      raise SweepError(f"metric {name!r}: unknown source {source!r}; use key, sft:key, after:field or before:field")


def _last_values(path: Path) -> dict[str, Any]:
  """The last value of every key in a JSONL metrics file; a torn line (a killed run) is skipped."""
  last: dict[str, Any] = {}
  if path.exists():
    for line in path.read_text(errors="replace").splitlines():
      with contextlib.suppress(json.JSONDecodeError):
        last.update(json.loads(line))
  return last


def _evaluation(result: Any) -> dict[str, Any]:
  """An evaluation of rl_summary.json (a dict, or EvalResult.to_json()'s string) with `pass@k` fields."""
  result = json.loads(result) if isinstance(result, str) else result or {}
  return {**result, **result.get("extra", {}), **{f"pass@{k}": v for k, v in result.get("pass_at_k", {}).items()}}


def _number(value: Any) -> float | None:
  try:
    return float(value)  # also "nan" / "inf", as the JSONL writer stores non-finite values
  except (TypeError, ValueError):
    return None


def read_metrics(workdir: str | os.PathLike, names: Sequence[str] = DEFAULT_METRICS) -> dict[str, float | None]:
  """The final metrics of one run (see the module docstring for the names); None where a value is missing."""
  check_metrics(names)
  workdir = Path(workdir)
  try:
    summary = json.loads((workdir / "rl_summary.json").read_text())
  except (OSError, ValueError):
    summary = {}
  found = {"": _last_values(workdir / "metrics.jsonl"), "sft": _last_values(workdir / "sft_metrics.jsonl"),
           "after": _evaluation(summary.get("after")), "before": _evaluation(summary.get("before"))}
  values = {}
  for name in names:
    source, _, key = name.rpartition(":")  # ("", "", name) when there is no ':'
    values[name] = _number(found[source].get(key))
  return values


# ------------------------------------------------------------------------------------------------------- output


def _fmt(value: Any) -> str:
  if value is None:
    return ""
  return f"{value:.4g}" if isinstance(value, float) else format_value(value)


def write_tables(results: Sequence[Result], sweep_dir: str | os.PathLike, metric_names: Sequence[str]) -> str:
  """Writes sweep_results.csv and sweep_results.md in sweep_dir; returns the markdown table."""
  from rl_lm.metrics import format_duration

  sweep_dir = Path(sweep_dir)
  keys = list(dict.fromkeys(k for r in results for k in r.point))
  header = [*keys, "status", "wall_s", *metric_names, "note"]

  def cells(r: Result, value: Callable[[Any], str], seconds: Callable[[float], str]) -> list[str]:
    """A row, missing values empty: `value` formats the overrides and the metrics, `seconds` the wall time."""
    return [*(value(r.point[k]) if k in r.point else "" for k in keys), r.status,
            "" if r.wall_s is None else seconds(r.wall_s),
            *("" if r.metrics.get(m) is None else value(r.metrics[m]) for m in metric_names), r.note]

  with open(sweep_dir / "sweep_results.csv", "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(header)
    writer.writerows(cells(r, format_value, "{:.1f}".format) for r in results)
  rows = ["| " + " | ".join(c.replace("|", "\\|") or "-" for c in cells(r, _fmt, format_duration)) + " |"
          for r in results]
  md = "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *rows]) + "\n"
  (sweep_dir / "sweep_results.md").write_text(md)
  return md


def plot(results: Sequence[Result], metric: str, out_png: str | os.PathLike) -> Path:
  """The metric against the first swept parameter, a line per value of the other swept parameters (dots on a
  categorical axis when the first is not a number). Points without the metric are left out."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  keys = list(dict.fromkeys(k for r in results for k in r.point))
  swept = [k for k in keys if len({format_value(r.point.get(k)) for r in results}) > 1]
  x_key = swept[0] if swept else None
  have = [r for r in results if r.metrics.get(metric) is not None and math.isfinite(r.metrics[metric])]
  xs = [r.point.get(x_key) if x_key else r.name for r in have]
  numeric = bool(xs) and all(isinstance(x, int | float) and not isinstance(x, bool) for x in xs)
  lines: dict[str, list[tuple[Any, float]]] = {}
  for r, x in zip(have, xs, strict=True):
    label = ", ".join(f"{k}={_fmt(r.point.get(k))}" for k in swept[1:]) or metric
    lines.setdefault(label, []).append((x if numeric else _fmt(x), r.metrics[metric]))  # text: categorical axis
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for label, xy in lines.items():
    ax.plot(*zip(*(sorted(xy) if numeric else xy), strict=True), marker="o", linestyle="-" if numeric else "",
            label=label)
  if numeric and min(xs) > 0 and max(xs) / min(xs) > 5:  # learning rates and the like are swept by factors
    ax.set_xscale("log")
  if not have:
    ax.text(0.5, 0.5, f"no values of {metric} yet", ha="center", va="center", transform=ax.transAxes)
  if len(lines) > 1:
    ax.legend(fontsize=8)
  ax.set_xlabel(x_key or "point")
  ax.set_ylabel(metric)
  ax.set_title(f"{metric} vs {x_key}" if x_key else metric)
  ax.grid(alpha=0.3)
  return plots.save(fig, out_png)


def summarise(results: Sequence[Result], sweep_dir: str | os.PathLike,
              metric_names: Sequence[str] = DEFAULT_METRICS) -> str:
  """Reads each point's final metrics, writes the tables and the plot; returns the markdown table."""
  for r in results:
    r.metrics = read_metrics(Path(sweep_dir) / r.name, metric_names)
  md = write_tables(results, sweep_dir, metric_names)
  plot(results, metric_names[0], Path(sweep_dir) / "sweep.png")
  return md


# ---------------------------------------------------------------------------------------------------------- CLI


def _fail(message: str) -> None:
  print(f"rl_lm.sweep: {message}", file=sys.stderr)
  sys.exit(2)


def main() -> None:
  """`python -m rl_lm.sweep ...`: the flags are defined here, so importing this module defines none."""
  from absl import app, flags
  from ml_collections import config_flags

  config_flag = config_flags.DEFINE_config_file("config", None, "A config file, optionally with :variant.",
                                                lock_config=True)
  workdir_flag = flags.DEFINE_string("workdir", None, "The sweep directory; each point runs in DIR/<name>.")
  parallel_flag = flags.DEFINE_integer("parallel", 1, "Points run at a time.", lower_bound=1)
  file_flag = flags.DEFINE_string("sweep_file", None, "Points as a JSON list or JSONL of dicts of dotted "
                                  "overrides; default: sweep() in the config file.")
  metrics_flag = flags.DEFINE_list("metrics", None, "Metric columns: key (metrics.jsonl), sft:key, after:field, "
                                   f"before:field; default: {','.join(DEFAULT_METRICS)}.")
  dry_flag = flags.DEFINE_boolean("dry_run", False, "Check and print the points and their commands; run nothing.")

  def parse(argv: list[str]) -> list[str]:
    from rl_lm.config import explain_flag_error

    try:
      return flags.FLAGS(argv)
    except Exception as e:  # noqa: BLE001 -- config_flags raises several types; all mean a bad command line
      _fail(f"invalid configuration: {explain_flag_error(argv, e)}")

  def run(argv: list[str]) -> None:
    del argv
    config = config_flag.value
    if config is None:
      _fail("--config is required, e.g. --config=configs/default.py")
    if not workdir_flag.value:
      _fail("--workdir is required")
    spec = config_flags.get_config_filename(flags.FLAGS["config"])
    common = dict(config_flags.get_override_values(flags.FLAGS["config"]))
    metric_names = tuple(metrics_flag.value or DEFAULT_METRICS)
    try:
      check_metrics(metric_names)
      points = load_sweep_file(file_flag.value) if file_flag.value else points_from_config(spec)
      names = check_points(config, points)
    except (SweepError, OSError) as e:
      _fail(f"invalid sweep: {e}")
    sweep_dir = Path(workdir_flag.value)
    print(f"sweep: {len(points)} points of {spec}, {parallel_flag.value} at a time, in {sweep_dir}", flush=True)
    if dry_flag.value:
      for name, point in zip(names, points, strict=True):
        print(f"{name}: {shlex.join(runs.command(spec, sweep_dir / name, override_flags({**common, **point})))}")
      return
    try:
      results = run_points(spec, sweep_dir, points, names, common, parallel_flag.value)
    except KeyboardInterrupt:
      print("sweep: interrupted; re-run the same command to finish the missing points", file=sys.stderr)
      sys.exit(130)
    print(summarise(results, sweep_dir, metric_names), end="")
    print(f"sweep: wrote {sweep_dir / 'sweep_results.csv'}, sweep_results.md and sweep.png", flush=True)
    failed = [r.name for r in results if r.status != "done"]
    if failed:
      print(f"sweep: {len(failed)} of {len(results)} points did not finish: {', '.join(failed)}", file=sys.stderr)
      sys.exit(1)

  app.run(run, flags_parser=parse)


if __name__ == "__main__":
  main()
