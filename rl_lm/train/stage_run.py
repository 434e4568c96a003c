"""A training stage's life on disk: checkpoints, resume, completion, its metrics file and summary, the
non-finite-update stop, and the prologue every stage shares (`StageRun.start`).

  <workdir>/checkpoints/<stage>/<step>/   Orbax items ("params", "opt", ...) + extra (JSON)
  <workdir>/checkpoints/<stage>/complete.json   written last: the stage finished (a rerun skips it)
  <workdir>/<stage>_summary.json   what the stage reports at its end (evaluations), written just before it

A stage saves every `config.checkpoint.every` steps and at its last step. The extra record holds the
step, the stage's number of steps (a rerun with another number is refused: the learning-rate schedule
spans them), the number of lines its metrics file had at that moment (a resumed run cuts the file back to
it, so rows written after the checkpoint by the killed run are not doubled), and whatever Python-side
state the stage needs (curriculum counts and generator state, the skipped-update streak).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl_lm.checkpoint import Checkpointer, CheckpointError, NonFiniteError, restore_item
from rl_lm.config import ConfigError
from rl_lm.train import state as state_lib
from rl_lm.train.context import Context

COMPLETE = "complete.json"


def is_main_process() -> bool:
  return jax.process_index() == 0


def speaker(log: Callable[[str], Any] = print) -> Callable[[str], Any]:
  """`log` on process 0, silence on the others: one process speaks."""
  return log if is_main_process() else lambda *_: None


def abstract(tree: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs carrying `shardings`, for restoring onto the mesh."""
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), tree, shardings)


def state_items(state: state_lib.TrainState, prefix: str = "") -> dict[str, Any]:
  """A TrainState as checkpoint items: `<prefix>params` alone (so later stages can read it) and `<prefix>opt`."""
  return {f"{prefix}params": state.params, f"{prefix}opt": {"step": state.step, "opt_state": state.opt_state}}


def state_from_items(items: Mapping[str, Any], prefix: str = "") -> state_lib.TrainState:
  opt = items[f"{prefix}opt"]
  return state_lib.TrainState(opt["step"], items[f"{prefix}params"], opt["opt_state"])


def state_targets(optimizer: Any, params_abstract: Any, shardings: state_lib.TrainState, prefix: str = ""
                  ) -> dict[str, Any]:
  """Restore targets of `state_items` for a state with these shardings (nothing is allocated)."""
  shapes = jax.eval_shape(lambda p: state_lib.TrainState(np.int32(0), p, optimizer.init(p)), params_abstract)
  return state_items(abstract(shapes, shardings), prefix)


def load_params(path: str, target: Any) -> Any:
  """The "params" item of a checkpoint folder (its latest step) or of one step folder: a stage's `init_from`."""
  params, _ = restore_item(path, "params", target)
  return params


def start_params(ctx: Context, init_from: str, stage: str, log: Callable[[str], Any] = print) -> Any:
  """The policy a stage starts from: the "params" of the checkpoint folder `init_from`, else `ctx.policy`."""
  if not init_from:
    return ctx.policy
  params = load_params(init_from, abstract(jax.eval_shape(lambda: ctx.policy), ctx.param_shardings))
  speaker(log)(f"{stage}: starting from the policy in {init_from}")
  return params


def frozen_copy(params: Any) -> Any:
  """`params` in new buffers with the same shardings: a frozen reference that donating `params` cannot delete."""
  shardings = jax.tree.map(lambda x: x.sharding, params)
  return jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=shardings)(params)


class SkipCounter:
  """Consecutive skipped updates (NaN/inf loss, gradients or updated state); `count` raises NonFiniteError
  (training stopped after `config.stop_after_nonfinite` of them in a row) at `stop_after`."""

  def __init__(self, stop_after: int, stage: str):
    self.stop_after, self.stage, self.streak = stop_after, stage, 0
    self.last_checkpoint: int | None = None

  def count(self, skipped: list[float], metrics: list[Mapping[str, Any]], step: int) -> None:
    """One flag (and metrics dict) per optimizer step, in order. Nothing is saved when this raises."""
    for flag, m in zip(skipped, metrics, strict=True):
      self.streak = self.streak + 1 if flag else 0
      if self.streak >= self.stop_after:
        bad = [f"{k}={float(v)}" for k, v in m.items() if np.ndim(v) == 0 and not np.isfinite(float(v))]
        last = self.last_checkpoint
        raise NonFiniteError(
          f"{self.stage} stopped at step {step}: {self.streak} updates in a row were skipped for a non-finite "
          f"loss, gradient or updated state ({', '.join(bad) or 'the new parameters or optimizer state'}); "
          f"config.stop_after_nonfinite={self.stop_after}. The last checkpoint ({f'step {last}' if last else 'none'}) "
          "is from before it")


def count_lines(path: str) -> int:
  if not os.path.exists(path):
    return 0
  with open(path, "rb") as f:
    return sum(1 for _ in f)


def checkpoint_due(config: Any, total_steps: int, step: int) -> bool:
  """Whether a stage of `total_steps` saves a checkpoint after `step` (`config.checkpoint.every`, and the last)."""
  every = config.checkpoint.every
  return step == total_steps or bool(every and step % every == 0)


class StageRun:
  """Checkpoints and the metrics file of one stage; `start_step` > 0 means a resume. A context manager
  (closed on leaving); `log` speaks on process 0 only."""

  def __init__(self, config: Any, workdir: str, stage: str, total_steps: int, metrics_file: str,
               skips: SkipCounter | None = None, log: Any = print):
    ck = config.checkpoint
    self.stage, self.total, self.every, self.log = stage, total_steps, ck.every, speaker(log)
    self.directory = os.path.join(workdir, "checkpoints", stage)
    self.metrics_path = os.path.join(workdir, metrics_file)
    self.summary_path = os.path.join(workdir, f"{stage}_summary.json")
    self.skips = skips or SkipCounter(config.stop_after_nonfinite, stage)
    self.ckpt = Checkpointer(self.directory, max_to_keep=ck.keep, async_save=ck.async_save)
    try:
      self._check(total_steps, ck.resume)
    except BaseException:
      self.ckpt.close()
      raise

  def __enter__(self) -> StageRun:
    return self

  def __exit__(self, *_: Any) -> None:
    self.close()

  def _check(self, total_steps: int, resume: bool) -> None:
    """Sets start_step and complete; refuses a workdir this run cannot continue."""
    stage, directory = self.stage, self.directory
    self.start_step = self.ckpt.latest_step() or 0
    done = self._completed_step()
    self.complete = done is not None and done == self.start_step  # else its last checkpoint was moved aside
    if self.start_step and not resume:
      raise CheckpointError(f"{directory} holds checkpoints (latest step {self.start_step}) and "
                            "config.checkpoint.resume is False: use a new --workdir or allow resuming")
    # The learning-rate schedule spans the stage's steps, so a stage is never stretched or cut short.
    key = f"config.{stage}.steps"
    if self.complete and done != total_steps:
      raise ConfigError(key, f"{total_steps}, but the {stage} stage in {directory} completed at step {done}: set it "
                        f"back to {done}, or train on in a new --workdir with --config.{stage}.init_from={directory}")
    if self.start_step:
      started = self.ckpt.restore(self.start_step, {})[1].get("total_steps")  # None: written before it was recorded
      if started is not None and started != total_steps:
        raise ConfigError(key, f"{total_steps}, but the {stage} stage in {directory} was started with {started} "
                          f"steps (its checkpoint at step {self.start_step}): set it back to {started}, or use a new "
                          "--workdir")
    if self.start_step > total_steps:
      raise ConfigError(key, f"{total_steps}, but {directory} holds step {self.start_step} of a longer {stage} "
                        "stage: set it back, or use a new --workdir")
    self.skips.last_checkpoint = self.start_step or None

  def _completed_step(self) -> int | None:
    """The step complete.json records, or None when the stage never completed."""
    path = os.path.join(self.directory, COMPLETE)
    if not os.path.exists(path):
      return None
    with open(path) as f:
      return int(json.load(f)["step"])

  def start(self, ctx: Context, targets: Mapping[str, Any], create: Callable[[Any], Any], init_from: str = "",
            from_items: Callable[[Mapping[str, Any]], Any] = state_from_items) -> tuple[Any, Any, dict[str, Any]]:
    """(state, params, extra) the stage starts with. Complete: (None, its last "params", their extra), and it has
    nothing to train. Else `params` are those it starts from (`init_from`'s, else `ctx.policy`), and the state is
    restored from the latest checkpoint (`targets`: every item's restore target; made a state by `from_items`)
    with that checkpoint's extra, or at step 0 `create(params)` with {} (the old metrics file set aside)."""
    if self.complete:
      items, extra = self.restore({"params": targets["params"]})
      self.log(f"{self.stage}: complete in {self.directory} (step {self.start_step}); loaded, nothing to train")
      return None, items["params"], extra
    params = start_params(ctx, init_from, self.stage, self.log)
    if not self.start_step:
      self.fresh_metrics()
      return create(params), params, {}
    items, extra = self.restore(targets)
    self.log(f"{self.stage}: resuming from step {self.start_step} of {self.total} ({self.directory})")
    return from_items(items), params, extra

  def restore(self, targets: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The latest checkpoint's items and extra; the metrics file is cut back to what it held then."""
    items, extra = self.ckpt.restore(self.start_step, targets)
    self.skips.streak = int(extra.get("nonfinite_streak", 0))
    if is_main_process() and not self.complete:
      _truncate_lines(self.metrics_path, int(extra.get("metrics_lines", 0)))
    return items, extra

  def fresh_metrics(self) -> None:
    """A run starting at step 0: an older metrics file in the workdir is kept aside as `.previous`."""
    if is_main_process() and os.path.exists(self.metrics_path):
      os.replace(self.metrics_path, self.metrics_path + ".previous")

  def due(self, step: int) -> bool:
    return step == self.total or bool(self.every and step % self.every == 0)  # `checkpoint_due`

  def save(self, step: int, items: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> None:
    record = {"step": step, "total_steps": self.total, "metrics_lines": count_lines(self.metrics_path),
              "nonfinite_streak": self.skips.streak, **(extra or {})}
    self.ckpt.save(step, items, record)
    self.skips.last_checkpoint = step

  def finish(self, summary: Mapping[str, Any] | None = None) -> None:
    """Waits for the last save, writes `summary` (if any) to `<stage>_summary.json`, marks the stage complete."""
    self.ckpt.wait()
    if is_main_process():
      if summary is not None:
        with open(self.summary_path, "w") as f:
          json.dump(summary, f, indent=1)
      tmp = os.path.join(self.directory, COMPLETE + ".tmp")
      with open(tmp, "w") as f:
        json.dump({"step": self.ckpt.latest_step()}, f)
      os.replace(tmp, os.path.join(self.directory, COMPLETE))
    self.complete = True

  def read_summary(self) -> dict[str, Any]:
    """What `finish` wrote; {} when it wrote none."""
    return json.loads(Path(self.summary_path).read_text()) if os.path.exists(self.summary_path) else {}

  def close(self) -> None:
    self.ckpt.close()


def _truncate_lines(path: str, n: int) -> None:
  """Keeps the first `n` lines of `path` (written through a temporary file, so a kill here loses nothing)."""
  if not os.path.exists(path):
    return
  with open(path) as f:
    lines = f.readlines()
  if len(lines) == n:
    return
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.writelines(lines[:n])
  os.replace(tmp, path)
