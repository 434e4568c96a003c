"""Two JAX processes on this machine, joined by `rl_lm.distributed.initialize`, act as one 8-device job.

`run_processes(script, n)` is the harness for any multi-process test: it starts `n` copies of a
Python script, each with 4 fake CPU devices and the coordinator on a free local port, and returns
their (returncode, stdout, stderr). The script joins with `join()`:

    from tests.test_distributed import join
    join()   # reads RL_LM_COORDINATOR / RL_LM_NUM_PROCESSES / RL_LM_PROCESS_ID set by run_processes
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from rl_lm import distributed

ROOT = Path(__file__).resolve().parents[1]
DEVICES_PER_PROCESS = 4
TIMEOUT_S = 120


def free_port() -> int:
  """A TCP port nobody listens on now (the OS picks it when we bind port 0)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def process_env(process_id: int, num_processes: int, port: int, devices: int = DEVICES_PER_PROCESS) -> dict[str, str]:
  """The environment of one process of a local run: fake CPU devices and where the coordinator is."""
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
  env.update(
    JAX_PLATFORMS="cpu",
    XLA_FLAGS=" ".join([*flags, f"--xla_force_host_platform_device_count={devices}"]),
    PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    **{distributed.ENV_COORDINATOR: f"127.0.0.1:{port}", distributed.ENV_NUM_PROCESSES: str(num_processes),
       distributed.ENV_PROCESS_ID: str(process_id)},
  )
  return env


def run_processes(script: str, num_processes: int = 2, timeout_s: float = TIMEOUT_S,
                  args: tuple[str, ...] = ()) -> list[tuple[int, str, str]]:
  """Runs `script` (Python source) in `num_processes` joined processes; (returncode, stdout, stderr) each.

  A process still running after `timeout_s` (a hang: a peer died, a collective never met) is
  killed, with all the others, and reported with returncode None, so a hang fails a test instead
  of blocking it. A port taken between choosing and binding it is retried once with another.
  """
  for attempt in range(2):
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", script, *args], cwd=ROOT, env=process_env(i, num_processes, port),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(num_processes)]
    deadline = time.monotonic() + timeout_s
    results = []
    for p in procs:
      try:
        out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        results.append((p.returncode, out, err))
      except subprocess.TimeoutExpired:
        for q in procs:
          q.kill()
        out, err = p.communicate()
        results.append((None, out, err + f"\n[killed after {timeout_s:.0f}s]"))
    for p in procs:  # peers of a killed process: collect what they wrote
      if p.poll() is None:
        p.kill()
      p.wait()
    in_use = any("address already in use" in err.lower() for _, _, err in results)
    if not in_use or attempt:
      return results
  return results


def join() -> bool:
  """For scripts run by `run_processes`: initialize from the environment (call before any other jax use)."""
  return distributed.initialize(local_device_count=DEVICES_PER_PROCESS)


# Each process builds its shards of a global [16, 8] array, sums it and multiplies it across the
# mesh, and gathers the results; both must equal the single-process numpy values.
SCRIPT = textwrap.dedent("""
  import json, sys
  from tests.test_distributed import join
  assert join()
  import jax, jax.numpy as jnp, numpy as np
  from jax.experimental import multihost_utils
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  from rl_lm import distributed

  x = np.arange(16 * 8, dtype=np.float32).reshape(16, 8) / 7.0
  mesh = Mesh(np.asarray(jax.devices()).reshape(4, 2), ("data", "model"))
  sharding = NamedSharding(mesh, P("data", "model"))
  gx = jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
  out = jax.jit(lambda a: (a.sum(), a @ a.T, jnp.tanh(a).sum(axis=0)),
                out_shardings=(NamedSharding(mesh, P()), sharding, NamedSharding(mesh, P())))(gx)
  total, gram, col = multihost_utils.process_allgather(out, tiled=True)
  print(json.dumps({
    "process_index": jax.process_index(), "process_count": jax.process_count(),
    "device_count": jax.device_count(), "local_device_count": jax.local_device_count(),
    "addressable_shards": len(gx.addressable_shards), "main": distributed.is_main_process(),
    "total": float(total), "gram": np.asarray(gram).tolist(), "col": np.asarray(col).tolist(),
  }))
""")


@pytest.fixture(scope="module")
def two_processes():
  return run_processes(SCRIPT, 2)


def test_two_processes_form_one_eight_device_job(two_processes):
  import json

  reports = []
  for rc, out, err in two_processes:
    assert rc == 0, err[-3000:]
    reports.append(json.loads(out.strip().splitlines()[-1]))
  assert sorted(r["process_index"] for r in reports) == [0, 1]
  assert [r["main"] for r in sorted(reports, key=lambda r: r["process_index"])] == [True, False]
  for r in reports:
    assert (r["process_count"], r["device_count"], r["local_device_count"]) == (2, 8, 4)
    assert r["addressable_shards"] == 4  # half of the 8 shards live in the other process


def test_sharded_computation_matches_one_process(two_processes):
  import json

  x = np.arange(16 * 8, dtype=np.float32).reshape(16, 8) / 7.0
  for rc, out, err in two_processes:
    assert rc == 0, err[-3000:]
    r = json.loads(out.strip().splitlines()[-1])
    np.testing.assert_allclose(r["total"], x.sum(), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(r["gram"]), x @ x.T, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(r["col"]), np.tanh(x).sum(axis=0), rtol=1e-5)


def test_single_process_settings_do_not_initialize(monkeypatch):
  for name in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES, distributed.ENV_PROCESS_ID,
               distributed.ENV_MULTIHOST, "SLURM_NTASKS", "TPU_WORKER_HOSTNAMES", "MEGASCALE_NUM_SLICES"):
    monkeypatch.delenv(name, raising=False)
  assert distributed.detect_cluster() is None
  assert distributed.initialize() is False
  assert distributed.initialize(num_processes=1) is False
  assert distributed.initialize(multihost=False) is False


@pytest.mark.parametrize(("kwargs", "env", "names"), [
  ({"coordinator_address": "127.0.0.1:1234"}, {}, "--num_processes"),
  ({"num_processes": 2, "process_id": 0}, {}, "--coordinator_address"),
  ({"coordinator_address": "127.0.0.1:1234", "num_processes": 2, "process_id": 2}, {}, "--process_id"),
  ({"coordinator_address": "localhost", "num_processes": 2, "process_id": 0}, {}, "host:port"),
  ({}, {distributed.ENV_NUM_PROCESSES: "two"}, distributed.ENV_NUM_PROCESSES),
  ({}, {distributed.ENV_MULTIHOST: "maybe"}, distributed.ENV_MULTIHOST),
])
def test_inconsistent_settings_name_the_setting(monkeypatch, kwargs, env, names):
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  with pytest.raises(distributed.DistributedError, match=names):
    distributed.initialize(**kwargs)


@pytest.mark.parametrize(("env", "found"), [
  ({"SLURM_NTASKS": "8", "SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0"}, "slurm"),
  ({"SLURM_NTASKS": "1", "SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "n1", "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0"}, None),
  ({"SLURM_NTASKS": "8", "SLURM_JOB_ID": "7"}, None),  # the batch script itself, not an srun step
  ({"TPU_WORKER_HOSTNAMES": "t-0,t-1,t-2,t-3"}, "tpu"),
  ({"TPU_WORKER_HOSTNAMES": "localhost"}, None),
  ({"MEGASCALE_NUM_SLICES": "2"}, "tpu multislice"),
])
def test_cluster_detection(monkeypatch, env, found):
  for name in ("SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_PROCID", "SLURM_LOCALID",
               "TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES", "MEGASCALE_NUM_SLICES",
               "MEGASCALE_COORDINATOR_ADDRESS", "OMPI_MCA_orte_hnp_uri"):
    monkeypatch.delenv(name, raising=False)
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  got = distributed.detect_cluster()
  assert (got.split(" (")[0] if got else None) == found


# launch/local.sh: the same harness as a script. A stand-in for `python` keeps these fast: it runs the
# port probe (`python -c ...`) as is and replaces `python -m rl_lm.main ...` by `body`.


def _local_sh(tmp_path, body: str, timeout_s: float = TIMEOUT_S) -> subprocess.CompletedProcess:
  fake = tmp_path / "python"
  fake.write_text(f'#!/usr/bin/env bash\nif [[ $1 == -c ]]; then exec {sys.executable} "$@"; fi\n{body}\n')
  fake.chmod(0o755)
  env = dict(os.environ, PYTHON=str(fake), PYTHONPATH=str(ROOT), NUM_PROCESSES="2", DEVICES_PER_PROCESS="4")
  return subprocess.run(["bash", str(ROOT / "launch" / "local.sh"), f"--workdir={tmp_path}/run"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout_s)


def test_local_launcher_joins_every_process(tmp_path):
  import json

  (tmp_path / "script.py").write_text(SCRIPT)
  run = _local_sh(tmp_path, f'exec {sys.executable} {tmp_path}/script.py')
  assert run.returncode == 0, run.stderr[-3000:]
  reports = [json.loads(ln) for ln in run.stdout.splitlines() if ln.startswith("{")]  # process 0 prints here
  reports += [json.loads(ln) for ln in (tmp_path / "run/logs/process_1.log").read_text().splitlines()
              if ln.startswith("{")]  # process 1 in its log
  assert sorted((r["process_index"], r["device_count"]) for r in reports) == [(0, 8), (1, 8)]


def test_local_launcher_stops_the_others_when_one_fails(tmp_path):
  body = ('if [[ $RL_LM_PROCESS_ID == 1 ]]; then sleep 1; echo "process 1 broke" >&2; exit 3; fi\n'
          f'echo $$ > {tmp_path}/pid0; exec sleep 600')
  start = time.monotonic()
  run = _local_sh(tmp_path, body, timeout_s=60)
  assert run.returncode == 3, run.stderr
  assert time.monotonic() - start < 30
  assert "process 1 exited with status 3" in run.stderr and "process 1 broke" in run.stderr
  pid0 = int((tmp_path / "pid0").read_text())
  deadline = time.monotonic() + 10
  while os.path.exists(f"/proc/{pid0}") and time.monotonic() < deadline:  # killed, then reaped
    time.sleep(0.05)
  assert not os.path.exists(f"/proc/{pid0}"), "process 0 outlived the launcher"


def test_local_launcher_runs_the_entry_point_like_one_process(tmp_path):
  """`launch/local.sh` with the real `rl_lm.main`: 2 processes x 4 devices sample what 1 process x 8 devices does."""
  args = ["--config=configs/sample.py:smoke", "--config.sample.num_batches=1", "--config.logging.wandb_mode=disabled"]
  env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHON=sys.executable, NUM_PROCESSES="2", DEVICES_PER_PROCESS="4")
  single = subprocess.Popen([sys.executable, "-m", "rl_lm.main", *args, f"--workdir={tmp_path}/single"], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # 8 devices (conftest), meanwhile
  try:
    multi = subprocess.run(["bash", str(ROOT / "launch" / "local.sh"), *args, f"--workdir={tmp_path}/multi"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    _, single_err = single.communicate(timeout=TIMEOUT_S)
  finally:
    single.kill()
  assert multi.returncode == 0, multi.stderr[-3000:]
  assert single.returncode == 0, single_err[-3000:]
  assert multi.stdout.count("rl_lm: stage sample") == 1  # process 0 only
  assert "rl_lm: stage" not in (tmp_path / "multi/logs/process_1.log").read_text()
  assert (tmp_path / "multi/done.json").exists()
  assert (tmp_path / "multi/samples.jsonl").read_text() == (tmp_path / "single/samples.jsonl").read_text()
