"""Metric writers: JSONL, console progress, Weights & Biases (offline by default), and run records.

Every writer follows the `MetricsWriter` protocol, `write(step, {name: scalar})` and `close()`, so a
TensorBoard writer (or any other sink) is one more class; `MultiWriter` fans out to several. Values may
be Python, numpy or jax scalars; `scalarize` turns them into plain Python numbers and refuses arrays of
more than one element by name.

JSONL format (`JsonlWriter`): one object per line, `{"step": s, **metrics}`. JSON has no NaN or
infinity, so non-finite floats are written as the strings "nan", "inf" and "-inf" (which `float()`
reads back; `read_jsonl` does it for you): the file stays strict JSON and a NaN stays distinguishable
from a missing value. The file is opened for append, so a resumed run continues it; readers keep the
last record of a step.

`TensorBoardWriter` writes event files (read back with `read_tensorboard`, by TensorBoard's own loader);
`WandbWriter` logs to a W&B run (its files are W&B's own business: `wandb sync` uploads an offline run);
`stage_writers` builds the optional TensorBoard and W&B writers of a training stage from `config.logging`.

`run_info` / `write_run_info` record what a run was (config, git commit, jax version, devices, host,
start time) in `run_info.json`; `plot_curves` draws chosen metrics from a JSONL file into one PNG.
"""

from __future__ import annotations

import datetime
import itertools
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, Self, TextIO, runtime_checkable

import numpy as np

from rl_lm import plots

Scalar = int | float | bool | str


@runtime_checkable
class MetricsWriter(Protocol):
  """Where scalar metrics go."""

  def write(self, step: int, metrics: Mapping[str, Any]) -> None: ...

  def close(self) -> None: ...


def scalarize(metrics: Mapping[str, Any]) -> dict[str, Scalar]:
  """Plain Python scalars from Python / numpy / jax scalars (or one-element arrays); strings pass through.

  Raises ValueError naming the key for an array of more than one element or an unsupported type.
  """
  out: dict[str, Scalar] = {}
  for key, v in metrics.items():
    if isinstance(v, str | bool | int | float):
      out[key] = v
      continue
    try:
      a = np.asarray(v)
    except Exception as e:  # noqa: BLE001
      raise ValueError(f"metric {key!r}: cannot convert {type(v).__name__} to a scalar") from e
    if a.size != 1:
      raise ValueError(f"metric {key!r}: expected a scalar, got an array of shape {a.shape}")
    a = a.reshape(())
    if a.dtype == bool:
      out[key] = bool(a)
    elif np.issubdtype(a.dtype, np.integer):
      out[key] = int(a)
    elif np.issubdtype(a.dtype, np.floating):
      out[key] = float(a)
    else:
      raise ValueError(f"metric {key!r}: unsupported dtype {a.dtype}")
  return out


def _json_value(v: Scalar) -> Scalar:
  if isinstance(v, float) and not math.isfinite(v):
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
  return v


_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
  """The records of a JSONL metrics file, with "nan"/"inf"/"-inf" strings turned back into floats."""
  with open(path) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [{k: _NON_FINITE.get(v, v) if isinstance(v, str) else v for k, v in rec.items()} for rec in records]


class _FileWriter:
  """A writer that owns one open file, `self._f` (None once closed), and is its own context manager."""

  path: Path
  _f: Any

  def _open_file(self) -> Any:
    if self._f is None:
      raise RuntimeError(f"{type(self).__name__}({self.path}) is closed")
    return self._f

  def close(self) -> None:
    if self._f is not None:
      self._f.close()
      self._f = None

  def __enter__(self) -> Self:
    return self

  def __exit__(self, *exc: object) -> None:
    self.close()


class JsonlWriter(_FileWriter):
  """Appends `{"step": s, **metrics}` per write to `path`, flushed every write (see module docstring)."""

  def __init__(self, path: str | os.PathLike) -> None:
    self.path = Path(path)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._f = open(self.path, "a")  # noqa: SIM115 -- closed in close()

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    f = self._open_file()
    record = {"step": int(step), **{k: _json_value(v) for k, v in scalarize(metrics).items()}}
    f.write(json.dumps(record, allow_nan=False) + "\n")
    f.flush()


# ---------------------------------------------------------------------------------------------- console

#: Short console names for common metric keys; other keys show their last path component.
ALIASES: dict[str, str] = {
  "rollout/reward_mean": "reward",
  "rollout/gold_mean": "gold",
  "rollout/pass_rate": "pass",
  "rollout/response_length_mean": "len",
  "rollout/truncation_rate": "trunc",
  "rollout/invalid_frac": "invalid",
  "groups/zero_variance_frac": "zvar",
  "policy/kl_ref_k3": "kl",
  "policy/kl_ref_k1": "kl1",
  "policy/entropy": "ent",
  "policy/clip_frac": "clip",
  "offpolicy/logprob_gap_mean_abs": "gap",
  "train/loss": "loss",
  "train/grad_norm": "gnorm",
  "perf/tokens_per_s": "tok/s",
  "eval/pass@1": "pass@1",
  "eval/greedy_accuracy": "greedy",
}

DEFAULT_CONSOLE_KEYS = (
  "rollout/reward_mean", "rollout/gold_mean", "rollout/pass_rate", "policy/kl_ref_k3", "policy/entropy",
  "rollout/response_length_mean", "groups/zero_variance_frac", "train/loss", "perf/tokens_per_s",
)


def format_duration(seconds: float) -> str:
  """42s, 3m44s, 2h03m."""
  if not math.isfinite(seconds):
    return "?"
  s = max(int(round(seconds)), 0)
  if s < 60:
    return f"{s}s"
  if s < 3600:
    return f"{s // 60}m{s % 60:02d}s"
  return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def format_value(v: Any) -> str:
  """Compact number: 0.41, 0.012, 1234, 3.2e-05; other values as str()."""
  if not isinstance(v, float) or not math.isfinite(v):  # anything but a finite float (bools and ints too)
    return str(v)
  a = abs(v)
  if a == 0:
    return "0"
  if a >= 100:
    return f"{v:.0f}"
  if a >= 1e-3:
    return f"{v:.3g}"
  return f"{v:.2e}"


class ConsoleProgress:
  """One line per logged step: `step 12/200 (6%) | 0.84 steps/s | ETA 3m44s | reward 0.41 | kl 0.012 | ...`.

  The step time is an exponential moving average over writes (`smoothing` is the weight of the newest
  interval, divided by the steps it covered); the first interval runs from construction (so it
  includes compilation) and is forgotten quickly. `clock` is injectable for tests.
  """

  def __init__(self, total_steps: int | None, keys: Sequence[str] = DEFAULT_CONSOLE_KEYS, every: int = 1,
               stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic, start_step: int = 0,
               smoothing: float = 0.3) -> None:
    self.total_steps, self.keys, self.every = total_steps, tuple(keys), max(int(every), 1)
    self.stream = stream if stream is not None else sys.stdout
    self.clock, self.smoothing = clock, smoothing
    self._last_step, self._last_time = int(start_step), clock()
    self.step_time: float | None = None  # EMA of seconds per step

  def _update_rate(self, step: int) -> None:
    now = self.clock()
    advanced = step - self._last_step
    if advanced > 0:
      dt = (now - self._last_time) / advanced
      self.step_time = dt if self.step_time is None else (1 - self.smoothing) * self.step_time + self.smoothing * dt
    self._last_step, self._last_time = step, now

  def format_line(self, step: int, metrics: Mapping[str, Any]) -> str:
    total = self.total_steps
    parts = [f"step {step}/{total} ({int(100 * step / total)}%)" if total else f"step {step}"]
    if self.step_time and self.step_time > 0:
      parts.append(f"{1.0 / self.step_time:.3g} steps/s")
      if total:
        parts.append(f"ETA {format_duration(max(total - step, 0) * self.step_time)}")
    values = scalarize({k: metrics[k] for k in self.keys if k in metrics})
    parts += [f"{ALIASES.get(k, k.rsplit('/', 1)[-1])} {format_value(v)}" for k, v in values.items()]
    return " | ".join(parts)

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    self._update_rate(int(step))
    if step % self.every == 0 or (self.total_steps is not None and step >= self.total_steps):
      self.log(self.format_line(int(step), metrics))

  def update(self, step: int, metrics: Mapping[str, Any]) -> None:
    """Alias of `write`."""
    self.write(step, metrics)

  def log(self, message: str) -> None:
    """A free-form line (alarms, stage changes)."""
    print(message, file=self.stream, flush=True)

  def close(self) -> None:
    self.stream.flush()


# ---------------------------------------------------------------------------------------------- wandb


class WandbWriter:
  """Weights & Biases run. mode "offline" (default) needs no network: `wandb sync <dir>/wandb/offline-run-*`
  uploads it later; "online" logs live; "disabled" does nothing and does not import wandb.

  Non-numeric values (strings) are not sent. `dir` is where the `wandb/` folder goes (created if missing).
  """

  def __init__(self, project: str, name: str | None = None, mode: str = "offline", dir: str | os.PathLike | None = None,
               config: Mapping[str, Any] | None = None, **init_kwargs: Any) -> None:
    if mode not in ("online", "offline", "disabled"):
      raise ValueError(f"WandbWriter: mode must be 'online', 'offline' or 'disabled', got {mode!r}")
    self.mode, self.run = mode, None
    if mode == "disabled":
      return
    import wandb

    if dir is not None:
      Path(dir).mkdir(parents=True, exist_ok=True)
    self.run = wandb.init(project=project, name=name, mode=mode, dir=None if dir is None else str(dir),
                          config=dict(config) if config is not None else None, **init_kwargs)

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    if self.run is None:
      return
    values = {k: v for k, v in scalarize(metrics).items() if not isinstance(v, str)}
    self.run.log(values, step=int(step))

  def close(self) -> None:
    """Finishes the run; idempotent."""
    if self.run is not None:
      self.run.finish()
      self.run = None


class MultiWriter:
  """Writes to every writer; `log` goes to those that have a `log` method."""

  def __init__(self, writers: Iterable[MetricsWriter]) -> None:
    self.writers = list(writers)

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    for w in self.writers:
      w.write(step, metrics)

  def log(self, message: str) -> None:
    for w in self.writers:
      if hasattr(w, "log"):
        w.log(message)

  def close(self) -> None:
    for w in self.writers:
      w.close()


# ---------------------------------------------------------------------------------------------- tensorboard


class TensorBoardWriter(_FileWriter):
  """TensorBoard event file in `logdir`: one `Event` per write, a scalar summary (`simple_value`, float32)
  per numeric metric under its key as tag (bools as 0/1; strings skipped).

  Written synchronously with the `tensorboard` package's protobuf classes and TFRecord writer (no TensorFlow
  or PyTorch import) and flushed at every write (no fsync, like `JsonlWriter`), so a killed run keeps every
  step written. Each writer starts a new file, named like TensorFlow's
  (`events.out.tfevents.<time>.<host>.<pid>.<n>`); TensorBoard merges the files of a folder, so a resumed
  run adds one.
  """

  _files = itertools.count()

  def __init__(self, logdir: str | os.PathLike) -> None:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    self._event_pb2, self._summary_pb2 = event_pb2, summary_pb2
    self.logdir = Path(logdir)
    self.logdir.mkdir(parents=True, exist_ok=True)
    name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(self._files)}"
    self.path = self.logdir / name
    self._f = RecordWriter(open(self.path, "xb"))  # noqa: SIM115 -- closed in close()
    self._write_event(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

  def _write_event(self, event: Any) -> None:
    records = self._open_file()
    records.write(event.SerializeToString())
    records.flush()

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    Value = self._summary_pb2.Summary.Value  # noqa: N806
    values = [Value(tag=k, simple_value=float(v)) for k, v in scalarize(metrics).items() if not isinstance(v, str)]
    if not values:
      return
    self._write_event(self._event_pb2.Event(wall_time=time.time(), step=int(step),
                                            summary=self._summary_pb2.Summary(value=values)))


def read_tensorboard(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
  """Scalars of the event files directly in `logdir`, `{tag: [(step, value), ...]}`, as TensorBoard reads them.

  Parsed by TensorBoard's own loader (`plugin_event_accumulator`, every event kept): `simple_value`
  summaries (what `TensorBoardWriter` writes) and scalar tensors (what `tf.summary.scalar` writes). Files
  are read in name order, i.e. the order they were started; the result is sorted by step and a step
  written twice (a resumed run) keeps its last value. A record cut short by a killed writer is ignored.
  """
  from tensorboard.backend.event_processing import plugin_event_accumulator as pea
  from tensorboard.plugins.scalar import metadata as scalar_metadata
  from tensorboard.util import tensor_util

  if not any(Path(logdir).glob("*tfevents*")):
    raise FileNotFoundError(f"{logdir}: no TensorBoard event files")
  acc = pea.EventAccumulator(str(logdir), size_guidance={pea.TENSORS: 0})
  acc.Reload()
  series: dict[str, list[tuple[int, float]]] = {}
  scalars = scalar_metadata.PLUGIN_NAME
  for tag in acc.PluginTagToContent(scalars) if scalars in acc.ActivePlugins() else ():
    by_step = {int(e.step): float(tensor_util.make_ndarray(e.tensor_proto).item()) for e in acc.Tensors(tag)}
    series[tag] = sorted(by_step.items())
  return series


# ---------------------------------------------------------------------------------------------- per stage


def stage_writers(config: Any, workdir: str | os.PathLike, stage: str) -> list[MetricsWriter]:
  """The optional writers of a training stage, from `config.logging` (JSONL and console are the trainer's).

  - `tensorboard`: a `TensorBoardWriter` at `<workdir>/tensorboard/<stage>`.
  - `wandb_mode` other than "disabled": a `WandbWriter` in project `wandb_project`, named
    `<basename(workdir)>-<stage>`, its `wandb/` folder under `workdir`, with the whole config. The run id is
    kept in `<workdir>/wandb_run_id_<stage>.txt`; when that file exists the run is resumed
    (`resume="allow"`), so a restarted run continues the same W&B run. If W&B fails to start, one warning
    line goes to stderr and the run goes on without it.

  Call from process 0 only; close the writers before the next stage starts its own.
  """
  lg, workdir = config.logging, Path(workdir)
  writers: list[MetricsWriter] = []
  if lg.tensorboard:
    writers.append(TensorBoardWriter(workdir / "tensorboard" / stage))
  if lg.wandb_mode != "disabled":
    id_file = workdir / f"wandb_run_id_{stage}.txt"
    run_id = id_file.read_text().strip() if id_file.exists() else ""
    resume = {"id": run_id, "resume": "allow"} if run_id else {}
    try:
      name = f"{os.path.basename(os.path.abspath(workdir))}-{stage}"
      wb = WandbWriter(lg.wandb_project, name=name, mode=lg.wandb_mode, dir=workdir, config=_plain_config(config),
                       **resume)
    except Exception as e:  # noqa: BLE001 -- W&B is optional: never let it stop a run
      reason = " ".join(f"{type(e).__name__}: {e}".split())
      print(f"WARNING: W&B did not start ({reason}); continuing without it", file=sys.stderr, flush=True)
    else:
      if not resume:
        _write_atomic(id_file, wb.run.id + "\n")
      writers.append(wb)
  return writers


# ---------------------------------------------------------------------------------------------- run records


def _write_atomic(path: Path, text: str) -> Path:
  """Writes `text` to `path` through a temporary file, so a reader never sees half of it; returns `path`."""
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(text)
  os.replace(tmp, path)
  return path


def git_commit(path: str | os.PathLike | None = None) -> str:
  """`git rev-parse HEAD` of the repository holding `path` (default: this package), or "unknown"."""
  cwd = Path(path) if path is not None else Path(__file__).resolve().parent
  try:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
  except (OSError, subprocess.SubprocessError):
    return "unknown"
  return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def _plain_config(config: Any) -> Any:
  if hasattr(config, "to_dict"):  # ml_collections.ConfigDict / FrozenConfigDict
    config = config.to_dict()
  return json.loads(json.dumps(config, default=str))


def run_info(config_dict: Any) -> dict[str, Any]:
  """What this run is: config, git commit, versions, devices, processes, host, start time (UTC, ISO 8601)."""
  import jax

  return {
    "config": _plain_config(config_dict),
    "git_commit": git_commit(),
    "jax_version": jax.__version__,
    "python_version": platform.python_version(),
    "devices": [str(d) for d in jax.devices()],
    "process_count": jax.process_count(),
    "process_index": jax.process_index(),
    "hostname": socket.gethostname(),
    "start_time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "argv": list(sys.argv),
  }


def write_run_info(workdir: str | os.PathLike, config_dict: Any) -> Path:
  """Writes `run_info(config_dict)` to `workdir/run_info.json` (atomically) and returns the path.

  In a multi-process run, call it from process 0 only.
  """
  Path(workdir).mkdir(parents=True, exist_ok=True)
  return _write_atomic(Path(workdir) / "run_info.json", json.dumps(run_info(config_dict), indent=2))


def write_done(workdir: str | os.PathLike, stages: Sequence[str]) -> Path:
  """`<workdir>/done.json`: written last, when every stage of the run has finished (sweeps skip such runs)."""
  done = {"stages": list(stages), "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
  return _write_atomic(Path(workdir) / "done.json", json.dumps(done) + "\n")


# ---------------------------------------------------------------------------------------------- plots


def plot_curves(jsonl_path: str | os.PathLike, keys: Sequence[str], out_png: str | os.PathLike,
                title: str | None = None) -> Path:
  """Draws each key against step from a JSONL metrics file, one small panel per key, in one PNG.

  Non-finite and non-numeric values are skipped; the last record of a repeated step wins; a key with no
  data gets an empty panel saying so.
  """
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  by_step: dict[int, dict[str, Any]] = {}
  for rec in read_jsonl(jsonl_path):
    by_step.setdefault(int(rec["step"]), {}).update(rec)
  steps = sorted(by_step)
  keys = list(keys)
  ncols = max(1, min(3, len(keys)))
  nrows = max(1, math.ceil(len(keys) / ncols))
  fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.6 * nrows), dpi=100, squeeze=False)
  for ax in axes.flat[len(keys):]:
    ax.axis("off")
  for i, (key, ax) in enumerate(zip(keys, axes.flat, strict=False)):
    xs, ys = [], []
    for s in steps:
      v = by_step[s].get(key)
      if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        xs.append(s)
        ys.append(v)
    ax.set_title(key, fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(True, alpha=0.3)
    if xs:
      ax.plot(xs, ys, lw=1.2, marker="." if len(xs) < 50 else None)
    else:
      ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, fontsize=8)
    if i >= len(keys) - ncols:
      ax.set_xlabel("step", fontsize=8)
  if title:
    fig.suptitle(title)
  return plots.save(fig, out_png)


__all__ = [
  "ALIASES", "ConsoleProgress", "JsonlWriter", "MetricsWriter", "MultiWriter", "TensorBoardWriter", "WandbWriter",
  "format_duration", "format_value", "git_commit", "plot_curves", "read_jsonl", "read_tensorboard", "run_info",
  "scalarize", "stage_writers", "write_run_info",
]
