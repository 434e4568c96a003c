"""Sweeps: run the points of a sweep on this machine, one after another or N at a time, and tabulate them.

  python -m rl_lm.sweep --config=configs/default.py --workdir=/tmp/rl_lm/sweep --parallel=2
  python -m rl_lm.sweep --config=configs/default.py:smoke --workdir=DIR --sweep_file=points.jsonl --dry_run
  python -m rl_lm.sweep --config=configs/ppo.py --workdir=DIR --sweep_file=points.json \\
      --metrics=eval/pass@1,rollout/reward_mean --config.rl.steps=40

A sweep is data: a list of points, each a dict of dotted overrides (`{"rl.learning_rate": 1e-4, "seed": 0}`),
returned by `sweep(arg)` beside `get_config(arg)` in the config file (`grid(...)` builds a cartesian product),
or read from `--sweep_file` (a JSON list of dicts, or JSONL with one dict per line). Every key is checked
against the config before anything starts (an unknown key or a value of the wrong type exits with status 2
and one line naming the point and the key); `--config.*` flags given to the sweep apply to every point
(a point's own value wins).

Each point runs `python -m rl_lm.main` in its own workdir `DIR/<name>`, where the name is made from the
point's overrides alone (`rl.learning_rate=0.0001,seed=0`; hashed when long), so a grown sweep keeps its
names. Output goes to `DIR/<name>/log.txt`. A point whose workdir holds `done.json` is skipped: re-running
the command after a crash or a failure runs only what is missing (the runs resume from their checkpoints).
A failing point does not stop the others.

At the end, one row per point (overrides, status, wall time, final metrics, and the last log line of a
failed point) goes to `DIR/sweep_results.csv`, `DIR/sweep_results.md` and the console, and the first metric
against the first swept parameter to `DIR/sweep.png`. Metric names (`--metrics`, comma separated):

  key          the last value of `key` in metrics.jsonl (the RL stage), e.g. rollout/reward_mean
  sft:key      the last value of `key` in sft_metrics.jsonl (the SFT stage), e.g. sft:train/loss
  after:field  a field of the evaluation after RL in rl_summary.json (pass@1, greedy_accuracy, ...);
  before:field the same before RL
"""

from __future__ import annotations

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
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Point = dict[str, Any]  # dotted config key -> value

DEFAULT_METRICS = ("after:pass@1", "after:greedy_accuracy", "rollout/reward_mean", "policy/kl_ref_k3",
                   "sft:train/loss")
MAX_NAME_LEN = 96
ROOT = Path(__file__).resolve().parents[1]  # the directory that holds rl_lm/, for the children's PYTHONPATH


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
  keys = list(merged)
  return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*merged.values())]


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
  if isinstance(value, str):
    return value
  return repr(value)


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
    digest = hashlib.sha1(json.dumps(_jsonable(point), sort_keys=True).encode()).hexdigest()[:10]
    name = f"{name[:MAX_NAME_LEN - 11].rstrip(',=')}-{digest}"
  return name


def _jsonable(point: Mapping[str, Any]) -> dict[str, Any]:
  return {k: (list(v) if isinstance(v, tuple) else v) for k, v in ((k, _plain(v)) for k, v in point.items())}


def _normalise(point: Any, where: str) -> Point:
  if not isinstance(point, Mapping):
    raise SweepError(f"{where}: a point must be a dict of dotted overrides, got {point!r}")
  out = {}
  for key, value in point.items():
    if not isinstance(key, str) or not key:
      raise SweepError(f"{where}: keys must be dotted config keys, got {key!r}")
    out[key.removeprefix("config.")] = _plain(value)
  return out


def load_sweep_file(path: str | os.PathLike) -> list[Point]:
  """The points of a sweep file: a JSON list of dicts, or JSONL with one dict per (non-blank) line."""
  text = Path(path).read_text()
  try:
    data = json.loads(text)
  except json.JSONDecodeError:
    points = []
    for i, line in enumerate(text.splitlines(), 1):
      if not line.strip():
        continue
      try:
        points.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise SweepError(f"{path}:{i}: not JSON ({e.msg}); a sweep file is a JSON list or a dict a line") from None
  else:
    points = data if isinstance(data, list) else [data]
  if not points:
    raise SweepError(f"{path}: no points")
  return [_normalise(p, f"{path}: point {i}") for i, p in enumerate(points, 1)]


def _load_module(config_path: str) -> Any:
  spec = importlib.util.spec_from_file_location("_rl_lm_sweep_config", config_path)
  if spec is None or spec.loader is None:
    raise SweepError(f"cannot load config file {config_path!r}")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def points_from_config(config_spec: str) -> list[Point]:
  """The points of `sweep(arg)` (or `sweep()`) defined beside `get_config` in a `path[:arg]` config file."""
  path, _, arg = config_spec.partition(":")
  module = _load_module(path)
  fn = getattr(module, "sweep", None)
  if fn is None:
    raise SweepError(f"{path} defines no sweep(); add one beside get_config or pass --sweep_file")
  points = fn(arg) if arg else fn()
  if not points:
    raise SweepError(f"{path}: sweep({arg!r}) returned no points")
  return [_normalise(p, f"{path}: sweep() point {i}") for i, p in enumerate(points, 1)]


def check_points(config: Any, points: Sequence[Point]) -> list[str]:
  """Checks every override against a (locked) config and returns the points' names.

  Raises SweepError naming the point and the key for an unknown key, a key that names a section, a value
  the field's type refuses, or two points with the same name.
  """
  import copy

  import ml_collections

  names: dict[str, int] = {}
  for i, point in enumerate(points, 1):
    name = point_name(point)
    where = f"point {i} of {len(points)} ({name})"
    probe = copy.deepcopy(config)
    for key, value in point.items():
      node, walked = probe, "config"
      parts = key.split(".")
      for part in parts[:-1]:
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
          raise SweepError(f"{where}: config.{key}: unknown key {part!r} under {walked}")
        node, walked = node[part], f"{walked}.{part}"
      leaf = parts[-1]
      if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
        known = ", ".join(sorted(node.keys())) if isinstance(node, ml_collections.ConfigDict) else "(not a section)"
        raise SweepError(f"{where}: config.{key}: unknown key {leaf!r} under {walked}; known keys: {known}")
      if isinstance(node[leaf], ml_collections.ConfigDict):
        raise SweepError(f"{where}: config.{key}: names a section, not a field; override its fields one by one")
      try:
        node[leaf] = value
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


def command(config_spec: str, workdir: str | os.PathLike, point: Mapping[str, Any],
            common: Mapping[str, Any] | None = None) -> list[str]:
  """The `python -m rl_lm.main` command line of one point; `common` overrides come first (the point wins)."""
  shared = {k: v for k, v in (common or {}).items() if k not in point}
  return [sys.executable, "-m", "rl_lm.main", f"--config={config_spec}", f"--workdir={workdir}",
          *override_flags(shared), *override_flags(point)]


def _last_line(path: Path) -> str:
  try:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()
             if ln.strip() and not ln.startswith("# rl_lm.sweep ")]
  except OSError:
    return ""
  return lines[-1][:200] if lines else ""


def _record(result: Result, workdir: Path, cmd: Sequence[str] | None) -> None:
  record = {"name": result.name, "overrides": _jsonable(result.point), "status": result.status,
            "wall_s": result.wall_s, "command": list(cmd) if cmd else None,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
  (workdir / "sweep_point.json").write_text(json.dumps(record, indent=1) + "\n")


def _child_env(parallel: int) -> dict[str, str]:
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
  if parallel > 1 and not any(k in env for k in ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE")):
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{0.9 / parallel:.3f}"  # N runs sharing one GPU each take a share
  return env


def run_points(config_spec: str, sweep_dir: str | os.PathLike, points: Sequence[Point], names: Sequence[str],
               common: Mapping[str, Any] | None = None, parallel: int = 1, poll_s: float = 0.2) -> list[Result]:
  """Runs the points not yet done, `parallel` at a time, printing a line per finished point."""
  from rl_lm.metrics import format_duration

  sweep_dir = Path(sweep_dir)
  results = [Result(name, dict(point)) for name, point in zip(names, points, strict=True)]
  total, finished, ran = len(results), 0, 0
  start = time.monotonic()

  def report(result: Result, message: str) -> None:
    nonlocal finished
    finished += 1
    elapsed = time.monotonic() - start
    left = total - finished
    eta = elapsed / ran * left if ran else (0.0 if not left else math.nan)
    print(f"sweep: [{finished}/{total}] {result.name}: {message} | elapsed {format_duration(elapsed)} | "
          f"ETA {format_duration(eta)}", flush=True)

  pending: deque[Result] = deque()
  for result in results:
    workdir = sweep_dir / result.name
    if (workdir / "done.json").exists():
      result.status = "done"
      try:
        result.wall_s = json.loads((workdir / "sweep_point.json").read_text())["wall_s"]
      except (OSError, ValueError, KeyError):
        pass
      report(result, "skipped (done.json)")
    else:
      pending.append(result)

  env = _child_env(parallel)
  running: dict[subprocess.Popen, tuple[Result, float, list[str], Any]] = {}
  try:
    while pending or running:
      while pending and len(running) < parallel:
        result = pending.popleft()
        workdir = sweep_dir / result.name
        workdir.mkdir(parents=True, exist_ok=True)
        cmd = command(config_spec, workdir, result.point, common)
        log = open(workdir / "log.txt", "a")  # noqa: SIM115 -- closed when the process ends
        log.write(f"# rl_lm.sweep {time.strftime('%Y-%m-%d %H:%M:%S')}: {shlex.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        running[proc] = (result, time.monotonic(), cmd, log)
      time.sleep(poll_s)
      for proc in [p for p in running if p.poll() is not None]:
        result, began, cmd, log = running.pop(proc)
        log.close()
        workdir = sweep_dir / result.name
        result.wall_s = time.monotonic() - began
        if proc.returncode != 0:
          result.status = f"failed (exit {proc.returncode})"
        elif not (workdir / "done.json").exists():
          result.status = "incomplete (no done.json)"
        else:
          result.status = "done"
        if result.status != "done":
          result.note = _last_line(workdir / "log.txt")
        ran += 1
        _record(result, workdir, cmd)
        report(result, f"{result.status} in {format_duration(result.wall_s)}"
                       + (f": {result.note}" if result.note else ""))
  except KeyboardInterrupt:
    for proc, (_, _, _, log) in running.items():
      proc.terminate()
      try:
        proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
      log.close()
    raise
  return results


# ------------------------------------------------------------------------------------------------------ metrics


def _last_values(path: Path, keys: Sequence[str]) -> dict[str, float | None]:
  """The last value of each key in a JSONL metrics file; a torn last line (a killed run) is ignored."""
  out: dict[str, float | None] = dict.fromkeys(keys)
  if not path.exists():
    return out
  for line in path.read_text(errors="replace").splitlines():
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      continue
    for key in keys:
      if key in record:
        out[key] = _number(record[key])
  return out


def _number(value: Any) -> float | None:
  try:
    return float(value)  # also "nan" / "inf", as the JSONL writer stores non-finite values
  except (TypeError, ValueError):
    return None


def _eval_field(result: Mapping[str, Any], field: str) -> float | None:
  if field.startswith("pass@"):
    return _number(result.get("pass_at_k", {}).get(field.removeprefix("pass@")))
  return _number(result.get(field))


def read_metrics(workdir: str | os.PathLike, names: Sequence[str] = DEFAULT_METRICS) -> dict[str, float | None]:
  """The final metrics of one run (see the module docstring for the names); None where a value is missing."""
  workdir = Path(workdir)
  rl_keys = [n for n in names if ":" not in n]
  sft_keys = [n.removeprefix("sft:") for n in names if n.startswith("sft:")]
  values = {**_last_values(workdir / "metrics.jsonl", rl_keys),
            **{f"sft:{k}": v for k, v in _last_values(workdir / "sft_metrics.jsonl", sft_keys).items()}}
  summary: dict[str, Any] = {}
  if any(n.startswith(("after:", "before:")) for n in names) and (workdir / "rl_summary.json").exists():
    try:
      summary = json.loads((workdir / "rl_summary.json").read_text())
    except json.JSONDecodeError:
      summary = {}
  for n in names:
    phase, _, field = n.partition(":")
    if phase in ("after", "before"):
      evaluation = summary.get(phase, {})
      if isinstance(evaluation, str):  # EvalResult.to_json() stored as a string
        evaluation = json.loads(evaluation)
      values[n] = _eval_field(evaluation, field)
    elif phase != "sft" and field:
      raise SweepError(f"metric {n!r}: unknown source {phase!r}; use key, sft:key, after:field or before:field")
  return {n: values.get(n) for n in names}


# ------------------------------------------------------------------------------------------------------- output


def _fmt(value: Any) -> str:
  if value is None:
    return ""
  if isinstance(value, float):
    return f"{value:.4g}"
  return format_value(value)


def write_tables(results: Sequence[Result], sweep_dir: str | os.PathLike, metric_names: Sequence[str]) -> str:
  """Writes sweep_results.csv and sweep_results.md in sweep_dir; returns the markdown table."""
  from rl_lm.metrics import format_duration

  sweep_dir = Path(sweep_dir)
  keys = list(dict.fromkeys(k for r in results for k in r.point))
  header = [*keys, "status", "wall_s", *metric_names, "note"]
  with open(sweep_dir / "sweep_results.csv", "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(header)
    for r in results:
      writer.writerow([format_value(r.point[k]) if k in r.point else "" for k in keys] + [
        r.status, "" if r.wall_s is None else f"{r.wall_s:.1f}",
        *("" if r.metrics.get(m) is None else repr(r.metrics[m]) for m in metric_names), r.note])
  rows = []
  for r in results:
    cells = [_fmt(r.point.get(k)) for k in keys] + [
      r.status, "" if r.wall_s is None else format_duration(r.wall_s), *(_fmt(r.metrics.get(m)) for m in metric_names),
      r.note]
    rows.append("| " + " | ".join(c.replace("|", "\\|") or "-" for c in cells) + " |")
  md = "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *rows]) + "\n"
  (sweep_dir / "sweep_results.md").write_text(md)
  return md


def _is_number(value: Any) -> bool:
  return isinstance(value, int | float) and not isinstance(value, bool)


def plot(results: Sequence[Result], metric: str, out_png: str | os.PathLike) -> Path:
  """The metric against the first swept parameter: a line per value of the other swept parameters when
  that parameter is numeric, else a bar per point. Points without the metric are left out."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  keys = list(dict.fromkeys(k for r in results for k in r.point))
  swept = [k for k in keys if len({format_value(r.point.get(k)) for r in results}) > 1]
  x_key = swept[0] if swept else None
  others = [k for k in swept if k != x_key]
  have = [r for r in results if r.metrics.get(metric) is not None and math.isfinite(r.metrics[metric])]
  fig, ax = plt.subplots(figsize=(7, 4.5))
  if not have:
    ax.text(0.5, 0.5, f"no values of {metric} yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
  elif x_key and all(_is_number(r.point.get(x_key)) for r in have):
    lines: dict[str, list[tuple[float, float]]] = {}
    for r in have:
      label = ", ".join(f"{k}={_fmt(r.point[k])}" for k in others if k in r.point) or metric
      lines.setdefault(label, []).append((r.point[x_key], r.metrics[metric]))
    for label, xy in lines.items():
      xy.sort()
      ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", label=label)
    xs = [r.point[x_key] for r in have]
    if min(xs) > 0 and max(xs) / min(xs) > 5:  # learning rates and the like are swept by factors
      ax.set_xscale("log")
    ax.set_xlabel(x_key)
    if len(lines) > 1:
      ax.legend(fontsize=8)
  else:
    labels = [", ".join(f"{k}={_fmt(r.point[k])}" for k in swept if k in r.point) or r.name for r in have]
    ax.bar(range(len(have)), [r.metrics[metric] for r in have])
    ax.set_xticks(range(len(have)), labels, rotation=30, ha="right", fontsize=8)
  ax.set_ylabel(metric)
  ax.set_title(f"{metric} vs {x_key}" if x_key else metric)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  out = Path(out_png)
  fig.savefig(out, dpi=100)
  plt.close(fig)
  return out


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
      for name in metric_names:
        phase, _, _ = name.partition(":")
        if ":" in name and phase not in ("sft", "after", "before"):
          raise SweepError(f"--metrics: {name!r} has an unknown source {phase!r}; use key, sft:key, after:field "
                           "or before:field")
      points = load_sweep_file(file_flag.value) if file_flag.value else points_from_config(spec)
      names = check_points(config, points)
    except (SweepError, OSError) as e:
      _fail(f"invalid sweep: {e}")
    sweep_dir = Path(workdir_flag.value)
    print(f"sweep: {len(points)} points of {spec}, {parallel_flag.value} at a time, in {sweep_dir}", flush=True)
    if dry_flag.value:
      for name, point in zip(names, points, strict=True):
        print(f"{name}: {shlex.join(command(spec, sweep_dir / name, point, common))}")
      return
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / "sweep_points.json").write_text(json.dumps(
      {"config": spec, "common": _jsonable(common), "points": [_jsonable(p) for p in points], "names": names},
      indent=1) + "\n")
    results: list[Result] = []
    try:
      results = run_points(spec, sweep_dir, points, names, common, parallel_flag.value)
    except KeyboardInterrupt:
      print("sweep: interrupted; re-run the same command to finish the missing points", file=sys.stderr)
      sys.exit(130)
    md = summarise(results, sweep_dir, metric_names)
    print(md, end="")
    print(f"sweep: wrote {sweep_dir / 'sweep_results.csv'}, sweep_results.md and sweep.png", flush=True)
    failed = [r.name for r in results if r.status != "done"]
    if failed:
      print(f"sweep: {len(failed)} of {len(results)} points did not finish: {', '.join(failed)}", file=sys.stderr)
      sys.exit(1)

  app.run(run, flags_parser=parse)


if __name__ == "__main__":
  main()
