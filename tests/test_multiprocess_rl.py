"""One RL step run by two processes (4 fake CPU devices each, joined over 127.0.0.1 with CPU collectives)
equals the same step run by one process with 8 devices: same sampled tokens, same metrics, same
parameters after the update.

Both runs build the trainer from tests/test_rl_loop.py's smoke config on a (2, 2, 2) mesh, so the data,
fsdp and tensor axes all cross the process boundary. SGD replaces AdamW, as in the sharding test of
test_rl_loop.py: Adam's first step divides by |g| + eps and would magnify float reduction-order noise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.test_distributed import ROOT, TIMEOUT_S, run_processes

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
  import json, sys
  out_dir = sys.argv[1]
  if sys.argv[2] == "multi":
    from tests.test_distributed import join
    assert join()
  import jax, numpy as np
  from rl_lm import mesh as mesh_lib
  from rl_lm.train import state as state_lib
  from rl_lm.train.context import make_context
  from rl_lm.train.rl import RLTrainer
  from tests.test_rl_loop import sgd, smoke_config

  state_lib.make_optimizer = sgd
  config = smoke_config("test_rl_digits")
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
  config.logging.wandb_mode = "disabled"
  assert jax.device_count() == 8
  ctx = make_context(config, out_dir)
  trainer = RLTrainer(ctx, log=lambda *_: None)
  collected = {}
  collect = trainer.source.next
  trainer.source.next = lambda step, version, timings: collected.setdefault("out", collect(step, version, timings))
  metrics = trainer.train_step(1)
  params = mesh_lib.fetch(trainer.state.policy.params)
  if jax.process_index() == 0:
    flat = {"/".join(str(k) for k in path): np.asarray(v) for path, v in jax.tree_util.tree_leaves_with_path(params)}
    np.savez(f"{out_dir}/params.npz", tokens=collected["out"][0].host.tokens, **flat)
    with open(f"{out_dir}/metrics.json", "w") as f:
      json.dump({k: v for k, v in metrics.items() if not k.startswith("perf/")}, f)
  print("process", jax.process_index(), "of", jax.process_count(), "done", flush=True)
""")


def test_two_process_rl_step_equals_the_single_process_step(tmp_path):
  multi, single = tmp_path / "multi", tmp_path / "single"
  multi.mkdir()
  single.mkdir()
  results = run_processes(SCRIPT, 2, timeout_s=2 * TIMEOUT_S, args=(str(multi), "multi"))
  for rc, _, err in results:
    assert rc == 0, err[-3000:]
  assert sorted(ln.split()[1] for _, out, _ in results for ln in out.splitlines() if ln.startswith("process")) \
    == ["0", "1"]

  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  env["XLA_FLAGS"] = " ".join([f for f in env.get("XLA_FLAGS", "").split()
                               if not f.startswith("--xla_force_host_platform_device_count")]
                              + ["--xla_force_host_platform_device_count=8"])
  run = subprocess.run([sys.executable, "-c", SCRIPT, str(single), "single"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=2 * TIMEOUT_S)
  assert run.returncode == 0, run.stderr[-3000:]

  a, b = np.load(multi / "params.npz"), np.load(single / "params.npz")
  np.testing.assert_array_equal(a["tokens"], b["tokens"])  # the same episodes were sampled
  assert set(a.files) == set(b.files) and len(a.files) > 5
  worst = max(float(np.max(np.abs(a[k] - b[k]))) for k in a.files if k != "tokens")
  assert worst < 1e-6, worst  # collectives over two processes may reduce in another order
  ma, mb = json.loads((multi / "metrics.json").read_text()), json.loads((single / "metrics.json").read_text())
  assert ma.keys() == mb.keys()
  for k in ma:
    np.testing.assert_allclose(ma[k], mb[k], rtol=1e-5, atol=1e-6, err_msg=k)
  assert ma["train/grad_norm"] > 0 and ma["groups/zero_variance_frac"] < 1  # a step that really moved
  print(f"max parameter difference, 2 processes vs 1: {worst:.2e}")
