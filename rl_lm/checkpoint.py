"""Checkpoints on Orbax: named array items (sharded or not) plus a JSON side record, last K kept.

`Checkpointer.save(step, items, extra)` writes each entry of `items` (a name -> pytree of arrays:
"params", "opt", "value_params", "kl", ...) as its own item, and `extra` (JSON: step, data position,
the state of Python-side generators) under `<directory>/<step>/`. Items are separate so that a later
stage can read one of them alone (the policy parameters of an SFT run) without knowing the rest.

Orbax writes into a temporary folder and renames it when complete, so a process killed mid-save
leaves the previous checkpoint usable; an incomplete folder is never listed as a step. Saves are
asynchronous: training continues while the arrays are written, and the next save (or
`wait()`/`close()`) waits for the previous one.

`restore(step, items)` reads the named items of the latest (or a given) step; a target of
`jax.ShapeDtypeStruct`s carrying shardings places arrays on the mesh as they load, `None` reads an
item as saved.

Fault injection for tests: with `RL_LM_FAULT=kill_mid_save:<name>:<step>` in the environment, a
process saving `<step>` into a folder called `<name>` SIGKILLs itself while that save is still being
written (the case atomic saves exist for).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp

EXTRA = "extra"


class CheckpointError(RuntimeError):
  """A checkpoint directory that cannot be read or used; the message names it."""

  user_facing = True  # rl_lm.main reports it in one line


def _abstract(target: Any) -> Any:
  if target is None:
    return None
  return jax.tree.map(lambda x: x if isinstance(x, jax.ShapeDtypeStruct) else ocp.utils.to_shape_dtype_struct(x),
                      target)


class Checkpointer:
  """Saves and restores (items, extra) by step in `directory`, keeping the last `max_to_keep`."""

  def __init__(self, directory: str, max_to_keep: int = 3, async_save: bool = True):
    if max_to_keep < 1:
      raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                           enable_async_checkpointing=async_save)
    try:
      self._manager = ocp.CheckpointManager(self.directory, options=options)
    except Exception as e:  # noqa: BLE001 -- an unreadable folder is reported with its path
      raise CheckpointError(f"cannot open checkpoint folder {self.directory}: {type(e).__name__}: {e}") from e

  def steps(self) -> list[int]:
    """Complete checkpoints, oldest first."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, items: Mapping[str, Any], extra: dict[str, Any] | None = None) -> None:
    """Starts writing checkpoint `step` (returns once the arrays are copied off the devices)."""
    if EXTRA in items:
      raise ValueError(f"the item name {EXTRA!r} is reserved for the JSON record")
    args = {name: ocp.args.StandardSave(tree) for name, tree in items.items()}
    args[EXTRA] = ocp.args.JsonSave(extra or {})
    self._manager.save(step, args=ocp.args.Composite(**args), force=True)
    _maybe_kill_mid_save(step, self.directory)

  def restore(self, step: int | None = None, items: Mapping[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """({name: tree}, extra) of `step` (default: the latest). `items`: {name: abstract target or None}."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no complete checkpoint in {self.directory}")
    args = {name: ocp.args.StandardRestore(_abstract(target)) for name, target in (items or {}).items()}
    args[EXTRA] = ocp.args.JsonRestore()
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**args))
    except Exception as e:  # noqa: BLE001 -- any failure to read is reported with the path
      raise CheckpointError(f"cannot restore step {step} from {self.directory}: {type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''}") from e
    return {name: restored[name] for name in (items or {})}, dict(restored[EXTRA] or {})

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


def step_folder(path: str) -> tuple[str, int | None]:
  """(checkpoint folder, step or None for its latest) for a path naming a folder or one step inside it."""
  path = os.path.abspath(path)
  name = os.path.basename(path)
  if name.isdigit() and os.path.isdir(os.path.join(path, EXTRA)):
    return os.path.dirname(path), int(name)
  return path, None


def restore_item(path: str, name: str, target: Any) -> tuple[Any, dict[str, Any]]:
  """One item (e.g. "params") from a checkpoint folder or a step folder in it, and that step's extra."""
  if not os.path.isdir(path):
    raise CheckpointError(f"no checkpoint folder {path}")
  directory, step = step_folder(path)
  with Checkpointer(directory, async_save=False) as ckpt:
    if step is None and ckpt.latest_step() is None:
      raise CheckpointError(f"no complete checkpoint in {directory}")
    items, extra = ckpt.restore(step, {name: target})
  return items[name], extra


def _maybe_kill_mid_save(step: int, directory: str) -> None:
  fault = os.environ.get("RL_LM_FAULT", "")
  if fault != f"kill_mid_save:{os.path.basename(directory)}:{step}":
    return
  # Wait until Orbax's temporary folder for this step exists (the save is under way), then die.
  deadline = time.monotonic() + 30
  while time.monotonic() < deadline:
    if any(n.startswith(f"{step}.") and "tmp" in n for n in os.listdir(directory)):
      break
    time.sleep(0.001)
  os.kill(os.getpid(), signal.SIGKILL)
