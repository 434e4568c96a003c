"""Checkpoints on Orbax: array state (sharded or not) plus a JSON side record, last K kept.

`Checkpointer.save(step, state, extra)` writes `state` (any pytree of arrays: parameters, optimizer
states, KL-controller state, curriculum counts) and `extra` (JSON: step, data position, RNG state of
Python-side generators) under `<directory>/<step>/`. Orbax writes into a temporary folder and
renames it when complete, so a process killed mid-save leaves the previous checkpoint usable; an
incomplete folder is never listed as a step. Saves are asynchronous: training continues while the
arrays are written, and the next save (or `wait()`/`close()`) waits for the previous one.

`restore(step=None, target=...)` reads the latest (or a given) step; with `target` a pytree of
`jax.ShapeDtypeStruct`s carrying shardings, arrays come back placed on the mesh as they load.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
  """A checkpoint directory that cannot be read; the message names it."""


class Checkpointer:
  """Saves and restores (state, extra) pairs by step in `directory`, keeping the last `max_to_keep`."""

  def __init__(self, directory: str, max_to_keep: int = 3, async_save: bool = True):
    if max_to_keep < 1:
      raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                           enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def steps(self) -> list[int]:
    """Complete checkpoints, oldest first."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state: Any, extra: dict[str, Any] | None = None) -> None:
    """Starts writing checkpoint `step` (returns once the arrays are copied off the devices)."""
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), extra=ocp.args.JsonSave(extra or {}))
    self._manager.save(step, args=args, force=True)

  def restore(self, step: int | None = None, target: Any = None) -> tuple[Any, dict[str, Any]]:
    """(state, extra) of `step` (default: the latest). `target`: abstract pytree with shardings, or None."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no complete checkpoint in {self.directory}")
    if target is not None:
      target = jax.tree.map(lambda x: x if isinstance(x, jax.ShapeDtypeStruct) else
                            ocp.utils.to_shape_dtype_struct(x), target)
    args = ocp.args.Composite(state=ocp.args.StandardRestore(target), extra=ocp.args.JsonRestore())
    try:
      restored = self._manager.restore(step, args=args)
    except Exception as e:  # noqa: BLE001 -- any failure to read is reported with the path
      raise CheckpointError(f"cannot restore step {step} from {self.directory}: {type(e).__name__}: {e}") from e
    return restored["state"], dict(restored["extra"] or {})

  def wait(self) -> None:
    """Blocks until every asynchronous save has finished."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()
