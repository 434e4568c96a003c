"""The step loop shared by the supervised stages (SFT, reward model, DPO): one jitted update per step on a
host batch, the non-finite streak, metrics to JSONL / TensorBoard / W&B with a progress line, periodic
checkpoints, and the stage's curves drawn at the end.

RL has its own loop (rl_lm/train/rl.py): a step there is sampling, scoring and several updates.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from rl_lm import mesh as mesh_lib
from rl_lm import metrics as metrics_lib
from rl_lm.train import stage_run
from rl_lm.train import state as state_lib
from rl_lm.train.context import Context


@dataclasses.dataclass(frozen=True)
class LoopSpec:
  """What differs between stages.

  stage: the name (checkpoint folder, writers, the progress line); steps, log_every: from its config.
  batch_at(step): the host batch of 0-based `step`; extra scalars to log may ride along under
    `host_metrics` (a dict) and are not sent to the device.
  console: (metric key, label) pairs shown on the progress line after the loss.
  curves: metric keys drawn in <workdir>/<stage>_curves.png at the end.
  save_last: False when the stage saves its last step itself (with more in it, after evaluating).
  """

  stage: str
  steps: int
  log_every: int
  batch_at: Callable[[int], dict[str, Any]]
  console: Sequence[tuple[str, str]] = ()
  curves: Sequence[str] = ("train/loss", "train/grad_norm")
  save_last: bool = True


def run_steps(ctx: Context, run: stage_run.StageRun, state: state_lib.TrainState, update: Any, spec: LoopSpec,
              key: jax.Array, log: Any) -> tuple[state_lib.TrainState, dict[str, float]]:
  """Steps `run.start_step` .. `spec.steps` of a stage; returns the final state and the last logged metrics."""
  main = stage_run.is_main_process()
  writers = metrics_lib.MultiWriter([metrics_lib.JsonlWriter(run.metrics_path),
                                     *metrics_lib.stage_writers(ctx.config, ctx.workdir, spec.stage)] if main else [])
  start, metrics = time.perf_counter(), {}
  # Each step's skip flag is read after the next step is dispatched, so the host never waits on the device
  # in between (its next batch is prepared while the update runs); before a log line or a save every flag
  # so far is read, so the streak (and the one a checkpoint records) is exact.
  unread: list[tuple[int, dict[str, jax.Array]]] = []

  def read_flags() -> None:
    while unread:
      s, m_s = unread.pop(0)
      skipped = float(m_s["train/skipped"])
      run.skips.count([skipped], [mesh_lib.fetch(m_s) if skipped else {}], s)

  for step in range(run.start_step, spec.steps):
    batch = spec.batch_at(step)
    host_metrics = batch.pop("host_metrics", {})
    batch = {k: mesh_lib.put(v, mesh_lib.batch_sharding(ctx.mesh, ctx.rules, np.shape(v))) for k, v in batch.items()}
    state, m = update(state, batch, jax.random.fold_in(key, step))
    read_flags()  # the previous step's, while this one runs
    unread.append((step + 1, m))
    if (step + 1) % spec.log_every == 0 or step + 1 == spec.steps:
      read_flags()
      metrics = {k: float(v) for k, v in mesh_lib.fetch(m).items()}
      metrics.update(host_metrics)
      writers.write(step + 1, metrics)
      rate = (step + 1 - run.start_step) / max(time.perf_counter() - start, 1e-9)
      shown = "".join(f" | {label} {metrics[k]:.3f}" for k, label in spec.console if k in metrics)
      log(f"{spec.stage} step {step + 1}/{spec.steps} | {rate:.1f} steps/s | ETA "
          f"{(spec.steps - step - 1) / max(rate, 1e-9):.0f}s | loss {metrics['train/loss']:.4f}{shown}")
    if run.due(step + 1) and (spec.save_last or step + 1 < spec.steps):
      read_flags()
      run.save(step + 1, stage_run.state_items(state))
  read_flags()
  writers.close()
  if main:
    metrics_lib.plot_curves(run.metrics_path, spec.curves, os.path.join(ctx.workdir, f"{spec.stage}_curves.png"),
                            title=spec.stage)
  return state, metrics
