"""Checkpoints: sharded round trip, last K kept, extra record, incomplete and corrupt directories."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_lm import mesh as mesh_lib
from rl_lm.checkpoint import Checkpointer, CheckpointError, restore_item
from rl_lm.models import build, presets


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
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), restored, state)
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
