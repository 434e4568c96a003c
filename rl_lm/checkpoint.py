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

Integrity: `save` refuses an item holding NaN or inf (`NonFiniteError`), and records a checksum of
each item in the extra record, computed on the devices where the (possibly sharded) arrays live: each
element's bits (bfloat16, int and bool as well as float32) mixed with its position by a bijection,
summed with wraparound, so any one changed element always changes it. `restore` recomputes it and a
mismatch is a `CheckpointError` naming the step, the item and the checkpoint before it. (Orbax 0.12.8
has no checksum of the array data: zarr3 checksums only its shard index.) Checkpoints written before
checksums were recorded load unverified; an item restored into another dtype (a cast) is not compared.

A failed write (a full disk) or read is one `CheckpointError` line. What Orbax and TensorStore print
around it (hundreds of traceback lines: the error logged by each of Orbax's threads, then "Exception
ignored" leftovers of the writes or reads still in flight) is kept off the console; the logged part rides
on the error as notes, so it reaches <workdir>/error.log with its traceback.

Fault injection for tests: with `RL_LM_FAULT=kill_mid_save:<name>:<step>` in the environment, a
process saving `<step>` into a folder called `<name>` SIGKILLs itself while that save is still being
written (the case atomic saves exist for).
"""

from __future__ import annotations

import collections
import logging
import os
import re
import signal
import sys
import time
import traceback
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from rl_lm import mesh as mesh_lib

EXTRA = "extra"
CHECKSUMS = "checksums"  # key of the extra record holding {item: {"values": hex, "layout": hex}}


class CheckpointError(RuntimeError):
  """A checkpoint directory that cannot be read, written or used; the message names it."""

  user_facing = True  # rl_lm.main reports it in one line


class NonFiniteError(RuntimeError):
  """A training state with NaN or inf in it: updates skipped too often in a row, or a save refused."""

  user_facing = True  # rl_lm.main reports it in one line


# ------------------------------------------------------------------------------------------------
# Checksums and the finiteness check, on the devices that hold the arrays

_C1, _C2, _C3 = np.uint32(0x9E3779B1), np.uint32(0x85EBCA77), np.uint32(0x2C1B3C6D)


def _mix(words: Any, index: Any) -> Any:
  """Each uint32 word mixed with its position; for a fixed position a bijection of the word (odd multiplies and
  xor-shifts), so a changed word always changes its term. Works on numpy and jax arrays alike."""
  h = words * _C1 + index * _C2
  h = h ^ (h >> np.uint32(16))
  h = h * _C3
  return h ^ (h >> np.uint32(15))


def _device_words(x: jax.Array) -> jax.Array:
  """The bits of `x` as uint32 words: one per element (two, on a trailing axis, for 64-bit types)."""
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  size = x.dtype.itemsize
  if size in (4, 8):
    return jax.lax.bitcast_convert_type(x, jnp.uint32)  # 64-bit: [..., 2]
  return jax.lax.bitcast_convert_type(x, jnp.uint16 if size == 2 else jnp.uint8).astype(jnp.uint32)


@jax.jit
def _device_digest(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(wrapping sum of the mixed words of `x`, all elements finite), both [] and computed where the shards
  live: the position of an element is built from iotas of its indices, so nothing is gathered."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  words = _device_words(x)
  index = jnp.zeros(words.shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(words.ndim)):  # row-major flat index, wrapping like the words
    index = index + jax.lax.broadcasted_iota(jnp.uint32, words.shape, axis) * np.uint32(stride % 2**32)
    stride *= words.shape[axis]
  finite = jnp.isfinite(x).all() if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.asarray(True)
  return jnp.sum(_mix(words, index), dtype=jnp.uint32), finite


def _host_digest(x: Any) -> tuple[int, bool]:
  """`_device_digest` of a numpy array or Python scalar, on the host (the same value for the same bits)."""
  a = np.ascontiguousarray(np.asarray(x))
  if a.dtype.kind in "USO":  # text: its encoded bytes
    a = np.frombuffer(str(a.tolist()).encode(), np.uint8)
  if a.dtype == np.bool_:
    a = a.astype(np.uint8)
  size = a.dtype.itemsize
  words = a.reshape(-1).view(np.uint32 if size in (4, 8) else np.uint16 if size == 2 else np.uint8).astype(np.uint32)
  index = np.arange(words.size, dtype=np.uint64).astype(np.uint32)
  finite = bool(np.isfinite(a).all()) if np.issubdtype(a.dtype, np.inexact) else True
  return int(np.sum(_mix(words, index), dtype=np.uint32)), finite


def _splitmix64(z: int) -> int:
  z = (z + 0x9E3779B97F4A7C15) % 2**64
  z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
  z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
  return z ^ (z >> 31)


def digest(tree: Any) -> tuple[dict[str, str], list[str]]:
  """({"values": hex, "layout": hex}, paths of leaves holding NaN or inf) of a pytree of arrays.

  "layout" covers each leaf's dtype and shape, "values" its bits too. Both are sums over the leaves, so they
  do not depend on the container types a restore without a target returns (dicts for named tuples).
  """
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  pending = [_device_digest(x) for _, x in leaves if isinstance(x, jax.Array)]
  fetched = iter(mesh_lib.fetch(pending))  # one transfer of two scalars per device leaf
  values = layout = 0
  bad = []
  for path, x in leaves:
    h, finite = next(fetched) if isinstance(x, jax.Array) else _host_digest(x)
    dtype = np.asarray(x).dtype if not hasattr(x, "dtype") else x.dtype
    shape = tuple(np.shape(x))
    kind = zlib.crc32(f"{dtype}{shape}".encode())
    values = (values + _splitmix64((int(h) << 32) | kind)) % 2**64
    layout = (layout + _splitmix64(kind)) % 2**64
    if not bool(finite):
      bad.append(jax.tree_util.keystr(path, simple=True, separator="/") or "(the whole item)")
  return {"values": f"{values:016x}", "layout": f"{layout:016x}"}, bad


# ------------------------------------------------------------------------------------------------
# Orbax's error logs


class _OrbaxErrors(logging.Filter):
  """Holds back the ERROR records of a failed write: Orbax's (it logs the traceback from each of its threads,
  some after the failure was raised) and asyncio's "exception was never retrieved" for the writes still in
  flight (logged when their futures are collected, possibly at exit; they name a file in a checkpoint
  folder). Installed with the first Checkpointer, for good, since they come late. The CheckpointError raised
  for the failure carries what was held back by then as notes, so it reaches <workdir>/error.log."""

  def __init__(self):
    super().__init__()
    self.records: collections.deque[logging.LogRecord] = collections.deque(maxlen=16)
    self.directories: set[str] = set()

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno < logging.ERROR:
      return True
    if f"{os.sep}orbax{os.sep}" in record.pathname or any(d in record.getMessage() for d in self.directories):
      self.records.append(record)
      return False
    return True

  def install(self, directory: str) -> None:
    if not self.directories:
      global _next_unraisablehook
      for name in ("absl", "asyncio"):
        logging.getLogger(name).addFilter(self)
      _next_unraisablehook, sys.unraisablehook = sys.unraisablehook, _quiet_orbax_leftovers
    self.directories.add(directory)

  def drain_into(self, error: BaseException) -> None:
    formatter = logging.Formatter("%(levelname)s %(name)s %(pathname)s:%(lineno)d: %(message)s")
    while self.records:
      error.add_note("Orbax logged: " + formatter.format(self.records.popleft()))


_ORBAX_ERRORS = _OrbaxErrors()
_next_unraisablehook = sys.unraisablehook


def _quiet_orbax_leftovers(unraisable: Any) -> None:
  """Drops the "Exception ignored" leftovers of a failed write or read: once the failure is raised, Orbax closes
  its event loop while TensorStore completes the other writes (each callback then fails with "Event loop is
  closed"), and its reads still pending are collected with their exceptions (a traceback and a TensorStore
  spec, 70 lines, per array). They say nothing the one error does not; everything else goes to the previous
  hook. Installed once, for good: they come whenever the garbage collector gets to them, often at exit."""
  e = unraisable.exc_value
  closed_loop = isinstance(e, RuntimeError) and str(e) == "Event loop is closed"
  from_orbax = any(f"{os.sep}orbax{os.sep}" in frame.f_code.co_filename
                   for frame, _ in traceback.walk_tb(unraisable.exc_traceback))
  if not (closed_loop or from_orbax):
    _next_unraisablehook(unraisable)


def _os_reason(e: BaseException) -> str:
  """The operating system's words for a failed write ("No space left on device"), else the error's first line."""
  text = str(e)
  found = re.search(r":\s*([^:\[]+?)\s*\[os_error_code='\d+'\]", text)
  if found:
    return found.group(1)
  if isinstance(e, OSError) and e.strerror:
    return e.strerror
  first = text.splitlines()[0] if text else ""
  return f"{type(e).__name__}: {first[:300]}"


def _abstract(target: Any) -> Any:
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
    self._pending: int | None = None  # the step of a save that may still be writing
    self._open = True
    _ORBAX_ERRORS.install(self.directory)

  def _writing(self, step: int | None, action: Callable[[], Any]) -> Any:
    """`action()`, a failure of Orbax's writing (now or of an earlier asynchronous save) as one CheckpointError."""
    try:
      return action()
    except Exception as e:  # noqa: BLE001 -- a failed write is reported with the folder, the step and the reason
      error = CheckpointError(f"saving checkpoint step {step} to {self.directory} failed: {_os_reason(e)}")
      _ORBAX_ERRORS.drain_into(error)
      raise error from e

  def _previous(self, step: int) -> str:
    earlier = [s for s in self.steps() if s < step]
    if not earlier:
      return "there is no earlier checkpoint in that folder"
    return (f"step {earlier[-1]} is the previous checkpoint: move {os.path.join(self.directory, str(step))} aside "
            "to resume from it")

  def steps(self) -> list[int]:
    """Complete checkpoints, oldest first."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, items: Mapping[str, Any], extra: dict[str, Any] | None = None) -> None:
    """Starts writing checkpoint `step` (returns once the arrays are copied off the devices).

    Raises NonFiniteError (nothing written) when an item holds NaN or inf, CheckpointError when the write fails."""
    if EXTRA in items:
      raise ValueError(f"the item name {EXTRA!r} is reserved for the JSON record")
    if CHECKSUMS in (extra or {}):
      raise ValueError(f"the extra key {CHECKSUMS!r} is reserved for the items' checksums")
    sums = {}
    for name, tree in items.items():
      sums[name], bad = digest(tree)
      if bad:
        raise NonFiniteError(f"refusing to save step {step} to {self.directory}: {name} holds NaN or inf values "
                             f"(in {', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''})")
    args = {name: ocp.args.StandardSave(tree) for name, tree in items.items()}
    args[EXTRA] = ocp.args.JsonSave({**(extra or {}), CHECKSUMS: sums})
    self.wait()  # an earlier save's failure names its step
    self._pending = step
    self._writing(step, lambda: self._manager.save(step, args=ocp.args.Composite(**args), force=True))
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
      first = str(e).splitlines()[0].split(" See full TensorStore details")[0][:300] if str(e) else ""
      error = CheckpointError(f"cannot restore step {step} from {self.directory} ({type(e).__name__}: {first}); "
                              f"{self._previous(step)}")
      _ORBAX_ERRORS.drain_into(error)
      raise error from e
    extra = dict(restored[EXTRA] or {})
    recorded = extra.pop(CHECKSUMS, {})  # absent in checkpoints written before checksums: not verified
    out = {name: restored[name] for name in (items or {})}
    for name, tree in out.items():
      if name in recorded:
        got, _ = digest(tree)
        if got["layout"] == recorded[name]["layout"] and got["values"] != recorded[name]["values"]:
          raise CheckpointError(f"checkpoint step {step} in {self.directory} is corrupt ({name} checksum mismatch); "
                                f"{self._previous(step)}")
    return out, extra

  def wait(self) -> None:
    """Blocks until every asynchronous save has finished."""
    self._writing(self._pending, self._manager.wait_until_finished)

  def close(self) -> None:
    if not self._open:
      return
    self._open = False
    try:
      self.wait()
    finally:
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
  with Checkpointer(directory, async_save=False) as ckpt:  # restore names an empty folder
    items, extra = ckpt.restore(step, {name: target})
  return items[name], extra


def _maybe_kill_mid_save(step: int, directory: str) -> None:
  fault = os.environ.get("RL_LM_FAULT", "")
  if fault != f"kill_mid_save:{os.path.basename(directory)}:{step}":
    return
  # Wait until Orbax's temporary folder for this step exists (the save is under way), then die.
  deadline = time.monotonic() + 30
  while time.monotonic() < deadline and not any(n.startswith(f"{step}.") and "tmp" in n for n in os.listdir(directory)):
    time.sleep(0.001)
  os.kill(os.getpid(), signal.SIGKILL)
