"""One model on meshes of several shapes (8 fake CPU devices): same numbers, really partitioned."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from rl_lm import mesh as mesh_lib
from rl_lm import sampling
from rl_lm.models import build, presets, transformer
from rl_lm.train import state as state_lib

CFG = presets.get("test")
SHAPES = [(1, 1, 1), (8, 1, 1), (2, 2, 2), (1, 4, 2)]
RULES = mesh_lib.DEFAULT_RULES

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices; see tests/conftest.py")


def _lm_loss(params, batch, rng):
  del rng
  logits = transformer.forward(CFG, params, batch["tokens"], batch["mask"])[:, :-1]
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, batch["tokens"][:, 1:, None], axis=-1)[..., 0]
  m = batch["mask"][:, 1:]
  return jnp.sum(nll * m) / jnp.sum(m), {}


def _run(shape):
  mesh = mesh_lib.make_mesh(*shape, devices=jax.devices()[: math.prod(shape)])
  params = build.init_params(CFG, mesh, RULES, jax.random.key(0))
  B, T = 8, 12
  toks = jax.random.randint(jax.random.key(1), (B, T), 3, 100, jnp.int32)
  mask = jnp.arange(T)[None, :] >= jnp.asarray([0, 2, 0, 5, 1, 0, 3, 0])[:, None]
  put = lambda x: jax.device_put(x, mesh_lib.batch_sharding(mesh, RULES, x.shape))
  toks, mask = put(toks), put(mask)

  forward = jax.jit(mesh_lib.bind(lambda p, t, m: transformer.forward(CFG, p, t, m), mesh, RULES))
  logits = forward(params, toks, mask)

  # Adam's first step is g / (|g| + eps): for gradients near 0 it magnifies float reduction-order noise
  # by lr / eps, so the comparison uses eps = 1e-6 (magnification 1e3) rather than 1e-8 (1e6).
  optimizer = state_lib.make_optimizer(1e-3, weight_decay=0.1, eps=1e-6)
  param_shardings = jax.tree.map(lambda x: x.sharding, params)
  state = state_lib.create(params, optimizer, mesh, param_shardings)
  shardings = state_lib.state_shardings(optimizer, jax.eval_shape(lambda: params), param_shardings, mesh)
  update = state_lib.make_update_fn(_lm_loss, optimizer, shardings, mesh, RULES)
  specs = {k: v.sharding.spec for k, v in state.params["layers"].items()}
  specs["embed"] = state.params["embed"].sharding.spec
  shard_shape = state.params["layers"]["w_gate"].addressable_shards[0].data.shape
  state, metrics = update(state, {"tokens": toks, "mask": mask}, jax.random.key(2))
  mu_spec = state.opt_state[1][0].mu["layers"]["w_gate"].sharding.spec

  prompts, lengths = toks[:, :6], put(jnp.asarray([6, 3, 6, 1, 4, 6, 2, 5], jnp.int32))
  gen = sampling.make_generate_fn(CFG, sampling.SamplingConfig(max_new_tokens=6, greedy=True), mesh, RULES)
  out = gen(state.params, prompts, lengths, jax.random.key(3))
  return dict(logits=np.asarray(logits), loss=float(metrics["train/loss"]),
              grad_norm=float(metrics["train/grad_norm"]), params=jax.tree.map(np.asarray, state.params),
              tokens=np.asarray(out.tokens), logprobs=np.asarray(out.logprobs), specs=specs,
              shard_shape=shard_shape, mu_spec=mu_spec, mask=np.asarray(mask))


@pytest.fixture(scope="module")
def results():
  return {shape: _run(shape) for shape in SHAPES}


@pytest.mark.parametrize("shape", SHAPES[1:])
def test_same_numbers_on_every_mesh(results, shape):
  ref, got = results[SHAPES[0]], results[shape]
  m = ref["mask"]
  np.testing.assert_allclose(got["logits"][m], ref["logits"][m], atol=1e-5)
  assert abs(got["loss"] - ref["loss"]) < 1e-5 and abs(got["grad_norm"] - ref["grad_norm"]) < 1e-5
  chex.assert_trees_all_close(got["params"], ref["params"], atol=1e-5)
  np.testing.assert_array_equal(got["tokens"], ref["tokens"])
  np.testing.assert_allclose(got["logprobs"], ref["logprobs"], atol=1e-5)


def test_parameters_are_partitioned(results):
  specs = results[(2, 2, 2)]["specs"]
  assert specs["w_gate"] == P(None, "fsdp", "tensor")
  assert specs["w_down"] == P(None, "tensor", "fsdp")
  assert specs["wq"] == P(None, "fsdp", "tensor", None)
  assert specs["embed"] == P("tensor", "fsdp")
  L, D, F = CFG.n_layers, CFG.d_model, CFG.mlp_dim
  assert results[(2, 2, 2)]["shard_shape"] == (L, D // 2, F // 2)
  assert results[(1, 4, 2)]["shard_shape"] == (L, D // 4, F // 2)
  assert results[(2, 2, 2)]["mu_spec"] == P(None, "fsdp", "tensor")  # optimizer moments follow their parameter
  assert all(a is None for a in results[(8, 1, 1)]["specs"]["w_gate"])  # pure data parallelism replicates weights


def test_logical_to_spec_rules():
  mesh = mesh_lib.make_mesh(2, 2, 2)
  spec = mesh_lib.logical_to_spec(("batch", "length", "embed"), RULES, mesh, (8, 4, 64))
  assert spec == P(("data", "fsdp"), None, None)  # embed gives way: fsdp is taken by batch
  assert mesh_lib.logical_to_spec(("vocab", "embed"), RULES, mesh, (127, 64)) == P(None, "fsdp")  # 127 % 2
  # Rule order decides a contested mesh axis (flax's semantics), not dimension order.
  assert mesh_lib.logical_to_spec(("embed", "batch"), RULES, mesh, (64, 8)) == P(None, ("data", "fsdp"))
  with pytest.raises(ValueError, match="config.mesh"):
    mesh_lib.make_mesh(3, 1, 1)
  assert dict(mesh_lib.make_mesh(-1, 2, 1).shape) == {"data": 4, "fsdp": 2, "tensor": 1}



@pytest.mark.parametrize(("shape", "spec"), [((1, 1, 1), P("data")), ((8, 1, 1), P()), ((8, 1, 1), P("data"))])
def test_put_copies_host_arrays(shape, spec):
  """`jax.device_put` on CPU may alias a numpy buffer (a replicated sharding does) or read it after returning (the
  transfer is asynchronous): a loop that resets its host arrays after queueing a call must not change what the
  call reads (the episode runner's restart flags did, under load)."""
  mesh = mesh_lib.make_mesh(*shape, devices=jax.devices()[: math.prod(shape)])
  for _ in range(10):
    host = np.zeros((8, 1 << 14), np.int32)
    placed = mesh_lib.put({"x": host}, jax.sharding.NamedSharding(mesh, spec))["x"]
    host[:] = 7
    assert all(int(np.asarray(s.data).max()) == 0 for s in placed.addressable_shards)
