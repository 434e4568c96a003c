"""Checkpoints: sharded round trip, last K kept, extra record, incomplete and corrupt directories, checksums,
non-finite states refused, a full disk in one line."""

import gc
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_lm import mesh as mesh_lib
from rl_lm.checkpoint import CHECKSUMS, Checkpointer, CheckpointError, NonFiniteError, restore_item
from rl_lm.models import build, presets

ROOT = Path(__file__).resolve().parents[1]


def _state(mesh):
  cfg = presets.get("test")
  params = build.init_params(cfg, mesh, mesh_lib.DEFAULT_RULES, jax.random.key(0))
  return {"params": params, "step": jnp.int32(7), "counts": np.arange(5, dtype=np.float64)}


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices")
def test_sharded_round_trip_keeps_values_and_placement(tmp_path):
  mesh = mesh_lib.make_mesh(2, 2, 2)
  state = _state(mesh)
  extra = {"data_position": 123, "rng": {"state": 2**100 + 5}, "ids": ["a", "b"]}
  with Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(10, {"state": state}, extra)
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
                        if isinstance(x, jax.Array) else x, state)
  with Checkpointer(str(tmp_path)) as ckpt:
    restored, got_extra = ckpt.restore(items={"state": target})
  restored = restored["state"]
  assert got_extra == extra
  chex.assert_trees_all_equal(restored, state)
  w = restored["params"]["layers"]["w_gate"]
  assert w.sharding.spec == state["params"]["layers"]["w_gate"].sharding.spec  # placed on the mesh as it loads


def test_keeps_the_last_k_and_restores_the_latest(tmp_path):
  with Checkpointer(str(tmp_path), max_to_keep=2) as ckpt:
    for step in (1, 2, 3):
      ckpt.save(step, {"x": {"v": jnp.full((3,), float(step))}}, {"step": step})
    ckpt.wait()
    assert ckpt.steps() == [2, 3]
    items, extra = ckpt.restore(items={"x": None})
  assert extra == {"step": 3} and np.asarray(items["x"]["v"]).tolist() == [3.0, 3.0, 3.0]


def test_an_incomplete_save_is_ignored_and_a_corrupt_one_is_a_clear_error(tmp_path):
  with Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, {"x": {"v": jnp.ones(2)}, "y": {"v": jnp.zeros(3)}}, {"step": 1})
  # A save killed midway leaves only Orbax's temporary folder: not a step.
  os.makedirs(tmp_path / "2.orbax-checkpoint-tmp-123")
  with Checkpointer(str(tmp_path)) as ckpt:
    assert ckpt.steps() == [1]
    assert ckpt.restore()[1] == {"step": 1}
  # A committed step whose files were lost cannot be read: a CheckpointError naming the directory.
  shutil.rmtree(tmp_path / "1" / "x")
  with Checkpointer(str(tmp_path)) as ckpt, pytest.raises(CheckpointError, match=str(tmp_path)):
    ckpt.restore(items={"x": {"v": jax.ShapeDtypeStruct((2,), jnp.float32)}})


def test_one_item_alone_from_a_folder_or_a_step_folder(tmp_path):
  with Checkpointer(str(tmp_path / "sft")) as ckpt:
    for step in (1, 2):
      ckpt.save(step, {"params": {"w": jnp.full((2,), float(step))}, "opt": {"m": jnp.zeros(2)}}, {"step": step})
  target = {"w": jax.ShapeDtypeStruct((2,), jnp.float32)}
  params, extra = restore_item(str(tmp_path / "sft"), "params", target)
  assert extra["step"] == 2 and np.asarray(params["w"]).tolist() == [2.0, 2.0]
  params, extra = restore_item(str(tmp_path / "sft" / "1"), "params", target)
  assert extra["step"] == 1 and np.asarray(params["w"]).tolist() == [1.0, 1.0]
  with pytest.raises(CheckpointError, match="no checkpoint folder"):
    restore_item(str(tmp_path / "nothing"), "params", target)


def test_empty_directory(tmp_path):
  with Checkpointer(str(tmp_path / "new")) as ckpt:
    assert ckpt.latest_step() is None
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
      ckpt.restore()


def _model_params():
  return build.init_params(presets.get("test"), mesh_lib.make_mesh(-1, 1, 1), mesh_lib.DEFAULT_RULES,
                           jax.random.key(0))


def _flip_bytes(step_dir: Path, where: float, n: int) -> None:
  """Inverts `n` bytes at fraction `where` of the largest file of the step's "params" item (its array data)."""
  files = [p for p in (step_dir / "params").rglob("*") if p.is_file()]
  data_file = max(files, key=lambda p: p.stat().st_size)
  data = bytearray(data_file.read_bytes())
  start = min(int(len(data) * where), len(data) - n)
  data[start:start + n] = bytes(b ^ 0xFF for b in data[start:start + n])
  data_file.write_bytes(data)


# A read that fails leaves Orbax's other reads to be collected with their exceptions ("Exception ignored", which
# rl_lm.checkpoint keeps off the console; pytest swaps in its own hook and turns them into this warning).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("where, cause", [((0.5, 0.35, 0.65, 0.45, 0.55), r"params checksum mismatch"),
                                          ((0.0,), r"cannot restore step 6")])
def test_flipped_bytes_in_the_parameter_data_are_one_clear_error(tmp_path, where, cause):
  # In the middle the flipped bytes usually still decode, to other numbers: only the checksum can tell. At the
  # start they break the compressed chunk's header and Orbax cannot read it. Either way: one line, the step, the
  # checkpoint before it. Orbax splits the data into one to three files, differently from run to run, so a spot
  # in the middle may also fall on a chunk's header: each spot is tried on a fresh copy of the step until one
  # still decodes, every one of them a clear error.
  params = _model_params()
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params)
  with Checkpointer(str(tmp_path)) as ckpt:
    for step in (4, 6):
      ckpt.save(step, {"params": params, "opt": {"m": params}}, {"step": step})
  pristine = tmp_path.parent / f"{tmp_path.name}_pristine6"
  shutil.copytree(tmp_path / "6", pristine)
  previous = f"step 4 is the previous checkpoint: move {tmp_path / '6'} aside to resume from it"
  for spot in where:
    shutil.rmtree(tmp_path / "6")
    shutil.copytree(pristine, tmp_path / "6")
    _flip_bytes(tmp_path / "6", spot, 64)
    with Checkpointer(str(tmp_path)) as ckpt, pytest.raises(CheckpointError) as e:
      ckpt.restore(items={"params": target})
    assert str(e.value).endswith(previous) and "\n" not in str(e.value)
    if re.search(cause, str(e.value)):
      break
  assert re.search(cause, str(e.value)), str(e.value)
  if cause.startswith("params"):
    assert str(e.value).startswith(f"checkpoint step 6 in {tmp_path} is corrupt (params checksum mismatch); ")
  with pytest.raises(CheckpointError, match=cause):  # an init_from or a completed stage's policy: the same check
    restore_item(str(tmp_path), "params", target)
  restored, extra = restore_item(str(tmp_path / "4"), "params", target)  # the one before is intact
  assert extra == {"step": 4}
  chex.assert_trees_all_equal(restored, params)
  with Checkpointer(str(tmp_path)) as ckpt:  # other items of the corrupt step still verify and load
    assert set(ckpt.restore(6, {"opt": None})[0]) == {"opt"}
  gc.collect()  # the failed reads' leftovers, while the warning filter holds


def test_checksums_cover_every_dtype_and_tolerate_old_checkpoints_and_casts(tmp_path):
  item = {"f32": jnp.linspace(-1, 1, 12).reshape(3, 4), "bf16": jnp.arange(6, dtype=jnp.bfloat16),
          "i32": jnp.arange(5), "flag": jnp.array([True, False]), "host": np.arange(3.0)}
  with Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, {"x": item}, {"step": 1})
  record_file = tmp_path / "1" / "extra" / "metadata"
  record = json.loads(record_file.read_text())
  assert set(record[CHECKSUMS]) == {"x"}
  with Checkpointer(str(tmp_path)) as ckpt:
    restored, extra = ckpt.restore(items={"x": None})
    assert extra == {"step": 1}  # the checksums are not handed back
    cast = ckpt.restore(items={"x": {**jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), item),
                                     "f32": jax.ShapeDtypeStruct((3, 4), jnp.bfloat16)}})[0]["x"]
  assert cast["f32"].dtype == jnp.bfloat16  # restored in another dtype: nothing to compare, no false alarm
  chex.assert_trees_all_equal(restored["x"], item)
  del record[CHECKSUMS]  # a checkpoint written before checksums existed
  record_file.write_text(json.dumps(record))
  with Checkpointer(str(tmp_path)) as ckpt:
    assert ckpt.restore(items={"x": None})[1] == {"step": 1}


def test_a_non_finite_state_is_never_saved(tmp_path):
  with Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, {"params": {"w": jnp.ones(3)}}, {"step": 1})
    with pytest.raises(NonFiniteError, match=rf"refusing to save step 2 to {tmp_path}: params holds NaN or inf "
                                             r"values \(in layers/w\)"):
      ckpt.save(2, {"params": {"layers": {"w": jnp.array([1.0, jnp.inf]), "n": jnp.arange(2)}}}, {"step": 2})
    assert ckpt.steps() == [1]


@pytest.fixture(params=["tmpfs", "file_size_limit"])
def full_disk(request, tmp_path):
  """(workdir, the OS error a checkpoint write will meet, shell prefix of the run)."""
  if request.param == "file_size_limit":
    # Files up to 146 KiB, below the model's parameter data file; a write past it fails (EFBIG) instead of
    # the signal killing the process.
    yield tmp_path / "run", "File too large", "ulimit -f 146; trap '' XFSZ; exec"
    return
  mount = tmp_path / "full"
  mount.mkdir()
  made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(mount)], capture_output=True)
  if made.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs here (needs root): {made.stderr.decode().strip()}")
  try:
    yield mount / "run", "No space left on device", "exec"
  finally:
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_during_a_save_is_one_line(full_disk):
  workdir, reason, prefix = full_disk
  command = [sys.executable, "-m", "rl_lm.main", "--config=configs/default.py:smoke", f"--workdir={workdir}",
             "--config.stages=('sft',)", "--config.sft.steps=4", "--config.checkpoint.every=2",
             "--config.logging.wandb_mode=disabled"]
  run = subprocess.run(["bash", "-c", f"{prefix} {shlex.join(command)}"], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
  lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
  assert run.returncode == 1
  assert lines == [f"rl_lm: error: saving checkpoint step 2 to {workdir}/checkpoints/sft failed: {reason}"], \
    run.stderr[-3000:]
  assert (workdir / "error.log").exists()  # where the traceback goes (as much of it as the full disk takes)
  assert not (workdir / "checkpoints" / "sft" / "complete.json").exists()
