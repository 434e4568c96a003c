"""Multi-process start: join this process to the others of a run through `jax.distributed`.

One JAX process runs per host (TPU VM worker, GPU node) or per GPU; together they see every device
of the job, `jax.devices()` lists all of them and the run's mesh spans them all. `initialize()`
must run before anything touches a JAX backend (`jax.devices()`, `jax.device_put`, any
computation): `rl_lm.main` calls it first thing. Where the settings come from, first match wins:

1. explicit arguments (`rl_lm.main` flags `--coordinator_address=host:port --num_processes=N
   --process_id=I`);
2. the environment: `RL_LM_COORDINATOR`, `RL_LM_NUM_PROCESSES`, `RL_LM_PROCESS_ID`;
3. a cluster JAX detects by itself (`jax.distributed.initialize()` with no arguments): a Slurm job
   step of several tasks (`srun`, SLURM_NTASKS > 1), an Open MPI job of several ranks, a TPU slice
   whose environment lists several workers (TPU_WORKER_HOSTNAMES / TPU_PROCESS_ADDRESSES, as on
   GKE) or several slices (MEGASCALE_*). A TPU VM pod started over ssh (launch/tpu_pod.sh) has no
   such variables (its topology is in the GCE metadata server, which is not queried from every
   process of every run): say so with `multihost=True` (`--multihost`, or `RL_LM_MULTIHOST=1`).
   `multihost=False` (`--nomultihost`, `RL_LM_MULTIHOST=0`) stays single-process even inside a
   cluster job.

A run of one process (`num_processes=1`, or nothing found) does not initialize anything.

Fake devices for testing on one machine: `local_device_count=N` gives each process N CPU devices
(the `jax_num_cpu_devices` option, set here before the backend starts). The environment variable
`XLA_FLAGS=--xla_force_host_platform_device_count=N` does the same but must be set before `jax` is
imported, so it belongs in the launching shell (launch/local.sh, tests/conftest.py). With CPU
devices only, cross-process collectives use gloo over TCP.

    from rl_lm import distributed
    distributed.initialize("127.0.0.1:12345", num_processes=2, process_id=0, local_device_count=4)
    jax.device_count()  # 8: four here, four in process 1
"""

from __future__ import annotations

import logging
import os
import re

ENV_COORDINATOR = "RL_LM_COORDINATOR"
ENV_NUM_PROCESSES = "RL_LM_NUM_PROCESSES"
ENV_PROCESS_ID = "RL_LM_PROCESS_ID"
ENV_MULTIHOST = "RL_LM_MULTIHOST"

_log = logging.getLogger(__name__)


class DistributedError(ValueError):
  """Inconsistent multi-process settings; the message names the flag or variable."""

  user_facing = True


def _env_int(name: str) -> int | None:
  value = os.environ.get(name, "").strip()
  if not value:
    return None
  try:
    return int(value)
  except ValueError:
    raise DistributedError(f"{name}={value!r} is not an integer") from None


def _env_bool(name: str) -> bool | None:
  value = os.environ.get(name, "").strip().lower()
  if value in ("", "auto"):
    return None
  if value in ("1", "true", "yes", "on"):
    return True
  if value in ("0", "false", "no", "off"):
    return False
  raise DistributedError(f"{name}={value!r}: use 1 (multi-host), 0 (single process) or auto")


def _count(value: str | None) -> int:
  return len([h for h in (value or "").split(",") if h.strip()])


def detect_cluster() -> str | None:
  """The multi-process cluster this process runs in, as JAX would find it; None for a lone process."""
  env = os.environ
  if _env_int("SLURM_NTASKS") and int(env["SLURM_NTASKS"]) > 1 and all(
      k in env for k in ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_PROCID", "SLURM_LOCALID")):
    return f"slurm ({env['SLURM_NTASKS']} tasks)"
  if "OMPI_MCA_orte_hnp_uri" in env and (_env_int("OMPI_COMM_WORLD_SIZE") or 1) > 1:
    return f"open mpi ({env['OMPI_COMM_WORLD_SIZE']} ranks)"
  hosts = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES")
  if _count(hosts) > 1:
    return f"tpu ({_count(hosts)} workers)"
  if (_env_int("MEGASCALE_NUM_SLICES") or 1) > 1 or "MEGASCALE_COORDINATOR_ADDRESS" in env:
    return f"tpu multislice ({env.get('MEGASCALE_NUM_SLICES', '?')} slices)"
  return None


def _cpu_only() -> bool:
  import jax

  platforms = jax.config.values.get("jax_platforms") or os.environ.get("JAX_PLATFORMS", "")
  return platforms.strip().lower() == "cpu"


def initialize(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  local_device_count: int | None = None,
  multihost: bool | None = None,
) -> bool:
  """Joins this process to a multi-process run; True if `jax.distributed.initialize` was called.

  Args:
    coordinator_address: "host:port" of process 0, which serves the coordinator there.
    num_processes: processes in the run (1: nothing to join).
    process_id: this process, in [0, num_processes).
    local_device_count: CPU devices this process gets (fake devices for tests on one machine).
    multihost: True: let JAX detect the cluster (TPU pods, Slurm, Open MPI) even without the hints
      `detect_cluster` looks for; False: never auto-detect; None (default): `RL_LM_MULTIHOST`, else auto.

  Raises DistributedError (naming the setting) for incomplete or inconsistent settings. Calling it
  again after it succeeded returns True and does nothing.
  """
  import jax

  if jax.distributed.is_initialized():
    return True
  if local_device_count is not None:
    if local_device_count < 1:
      raise DistributedError(f"local_device_count must be >= 1, got {local_device_count}")
    if "jax_num_cpu_devices" not in jax.config.values:
      raise DistributedError("this jax has no jax_num_cpu_devices option: set XLA_FLAGS="
                             f"--xla_force_host_platform_device_count={local_device_count} before starting Python")
    jax.config.update("jax_num_cpu_devices", int(local_device_count))

  coordinator = coordinator_address or os.environ.get(ENV_COORDINATOR, "").strip() or None
  n = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
  pid = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
  if coordinator is not None or n is not None or pid is not None:
    if n is not None and n < 1:
      raise DistributedError(f"--num_processes ({ENV_NUM_PROCESSES}) must be >= 1, got {n}")
    if n == 1 and pid in (None, 0):
      return False
    missing = [name for name, v in (("--coordinator_address", coordinator), ("--num_processes", n),
                                    ("--process_id", pid)) if v is None]
    if missing:
      raise DistributedError(
        f"a multi-process run needs --coordinator_address, --num_processes and --process_id (or {ENV_COORDINATOR}, "
        f"{ENV_NUM_PROCESSES}, {ENV_PROCESS_ID}); missing {', '.join(missing)}")
    if not 0 <= pid < n:
      raise DistributedError(f"--process_id ({ENV_PROCESS_ID}) must be in [0, {n}), got {pid}")
    if not re.fullmatch(r"\S+:\d+", coordinator):
      raise DistributedError(f"--coordinator_address ({ENV_COORDINATOR}) must be host:port, got {coordinator!r}")
    _prepare_collectives(local_device_count)
    # Everything is given: no cluster detection (inside a Slurm allocation it would also pick this process's GPUs).
    jax.distributed.initialize(coordinator, num_processes=n, process_id=pid, cluster_detection_method="deactivate")
    return True

  mode = multihost if multihost is not None else _env_bool(ENV_MULTIHOST)
  if mode is False:
    return False
  found = detect_cluster()
  if mode is None and found is None:
    return False
  _prepare_collectives(local_device_count)
  try:
    jax.distributed.initialize()
  except ValueError as e:  # nothing detected: JAX asks for a coordinator address
    raise DistributedError(f"--multihost: no cluster found to join ({e}); name one with --coordinator_address, "
                           "--num_processes and --process_id") from e
  _log.info("joined %s", found or "the cluster JAX detected")  # (asking for the process index would start the backend)
  return True


def _prepare_collectives(local_device_count: int | None) -> None:
  """CPU-only runs talk across processes with gloo (must be chosen before the backend starts)."""
  import jax

  if (local_device_count is not None or _cpu_only()) and "jax_cpu_collectives_implementation" in jax.config.values:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")


def is_main_process() -> bool:
  """True in process 0 (and in a single-process run): the one that prints progress and writes shared files."""
  import jax

  return jax.process_index() == 0
