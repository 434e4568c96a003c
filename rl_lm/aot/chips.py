"""TPU chips and slices, and NVIDIA GPUs and their hosts: the figures every estimate divides by, and their names.

Chip facts, per chip, from the Cloud TPU system-architecture pages (https://cloud.google.com/tpu/docs/<v4 | v5e |
v5p | v6e>), except where `Chip.source` says otherwise. `hbm_gib` is the documented capacity; `usable_gib` is
what XLA:TPU lets one program use, read from its own RESOURCE_EXHAUSTED message ("... exceeds available HBM
(15.75G)") when a program too large for each chip was compiled here (libtpu 0.0.42.1); fits are judged against it.

A slice is named either as Cloud TPU accelerator types name it, `<version>-<N>`, or as jax's topology
descriptions do, `<version>:<AxB[xC]>`. In accelerator types v4 and v5p count TensorCores (two per chip, one
device per chip in megacore mode), so v5p-64 is 32 chips; v5e (v5litepod) and v6e count chips. A count is
turned into the standard slice shape by doubling the smallest side, as the shape tables of those pages grow:
3-D 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, ...; 2-D 1x1, 2x2, 2x4, 4x4, 4x8, ... . Another shape (v5p-384's
4x4x12) is given by its jax name. Hosts: four chips per host, except slices of up to eight v5e / v6e chips,
which are one host.

GPUs are named `<gpu>-<N>`: `h100-8` is one host of 8 H100 SXM GPUs, `h100-16` two (up to 8 GPUs on one host,
then whole hosts of 8). XLA compiles for them on this CPU through the CUDA plugin (jax-cuda12-plugin, with ptxas
from the nvidia-cuda-nvcc-cu12 wheel; no GPU, no driver), from a description of the GPU (`h100_sxm.txtpb` beside
this file, written from NVIDIA's figures). XLA:GPU does not refuse a program larger than the GPU at compile time;
fits are judged against `usable_gib`: the share of the GPU's memory JAX's allocator takes by default
(XLA_PYTHON_CLIENT_MEM_FRACTION=0.75; `rl_lm.main` leaves it so), of the total CUDA reports.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
from pathlib import Path
from typing import Any

GIB = 2.0**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU chip generation, or one GPU. Bandwidths in bytes/s, peak in FLOP/s (dense bf16)."""

  name: str  # v4 | v5e | v5p | v6e | h100
  device_kind: str  # what jax's compile-only devices report
  hbm_gib: float
  usable_gib: float
  peak_flops: float
  hbm_bandwidth: float
  ici_bandwidth: float  # bidirectional, per chip: ICI (TPU), NVLink within a host (GPU)
  dims: int  # the slice's torus: 2-D (v5e, v6e) or 3-D (v4, v5p); 0 for a GPU
  cores_per_chip: int  # TensorCores counted by the accelerator type's number
  source: str
  platform: str = "tpu"  # tpu | cuda
  per_host: int = 0  # GPUs on one host (a node)
  host_bandwidth: float = 0.0  # bidirectional, per GPU, between hosts (its network interface)
  usable_note: str = ""  # where usable_gib comes from, when it is not XLA's own figure

  @property
  def usable_bytes(self) -> float:
    return self.usable_gib * GIB


CHIPS: dict[str, Chip] = {
  "v4": Chip("v4", "TPU v4", 32.0, 30.75, 275e12, 1200e9, 600e9, 3, 2,
             "cloud.google.com/tpu/docs/v4 (275 TFLOP/s bf16, 32 GiB HBM2 at 1200 GB/s); ICI: 6 links x 50 GB/s each "
             "way (Jouppi et al., TPU v4, ISCA 2023; the v4 page states no per-chip figure)"),
  "v5e": Chip("v5e", "TPU v5 lite", 16.0, 15.75, 197e12, 819e9, 400e9, 2, 1,
              "cloud.google.com/tpu/docs/v5e (197 TFLOP/s bf16, 16 GB HBM2 at 819 GB/s, 400 GB/s bidirectional ICI)"),
  "v5p": Chip("v5p", "TPU v5", 95.0, 95.74, 459e12, 2765e9, 1200e9, 3, 2,
              "cloud.google.com/tpu/docs/v5p (459 TFLOP/s bf16, 95 GiB HBM2e at 2765 GB/s, 1200 GB/s bidirectional "
              "ICI)"),
  "v6e": Chip("v6e", "TPU v6 lite", 32.0, 31.25, 918e12, 1638e9, 800e9, 2, 1,
              "cloud.google.com/tpu/docs/v6e (918 TFLOP/s bf16, 32 GB HBM at 1638 GB/s, 800 GB/s bidirectional ICI)"),
}

# GPUs. H100 SXM5 80GB: NVIDIA's H100 datasheet and product page (nvidia.com/en-us/data-center/h100): 989 TFLOP/s
# dense bf16 (1,979 with sparsity), 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s (bidirectional, per GPU). CUDA reports
# 84,942,979,072 bytes (79.11 GiB) of it as the device's total memory (the figure XLA's own description of a real
# H100 SXM records, xla/backends/gpu/target_config/specs/h100_sxm.txtpb); JAX's allocator takes 75% of that unless
# XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise (jax.readthedocs.io, "GPU memory allocation"). Between hosts: one
# ConnectX-7 400 Gb/s InfiniBand port per GPU (NVIDIA DGX H100 datasheet: 8 per node), 50 GB/s each way.
_H100_TOTAL_GIB = 84942979072 / GIB
GPUS: dict[str, Chip] = {
  "h100": Chip("h100", "NVIDIA H100 80GB HBM3", _H100_TOTAL_GIB, 0.75 * _H100_TOTAL_GIB, 989e12, 3.35e12, 900e9, 0,
               1, "NVIDIA H100 datasheet, nvidia.com/en-us/data-center/h100 (H100 SXM: 989 TFLOP/s bf16 dense, 80 GB "
               "HBM3 at 3.35 TB/s, NVLink 900 GB/s bidirectional); between hosts one 400 Gb/s ConnectX-7 per GPU "
               "(NVIDIA DGX H100 datasheet)", platform="cuda", per_host=8, host_bandwidth=100e9,
               usable_note="JAX's default GPU memory pool: 75% (XLA_PYTHON_CLIENT_MEM_FRACTION) of the 79.11 GiB "
                           "CUDA reports"),
}
# The description of each GPU XLA compiles for (a GpuTargetConfigProto in text form), beside this file.
TARGET_CONFIGS = {"h100": Path(__file__).with_name("h100_sxm.txtpb")}
CUDA_PACKAGES = "jax-cuda12-plugin==0.10.2 nvidia-cuda-nvcc-cu12==12.9.86 nvidia-cuda-runtime-cu12==12.9.79"

# Names a version goes by: in accelerator types (v5litepod-8), in jax topology names (v5p:2x2x2 or v5:2x2x2).
_ALIASES = {"v4": "v4", "v5p": "v5p", "v5": "v5p", "v5e": "v5e", "v5litepod": "v5e", "v6e": "v6e"}
_EXAMPLES = ("an accelerator type (v5p-64, v5litepod-8, v5e-8, v6e-8, v4-32), a jax topology (v5e:2x2, v5p:2x2x2) "
             "or GPUs (h100-8, h100-16)")


class TopologyError(ValueError):
  """A slice name this module cannot resolve; the message says what it accepts."""


@dataclasses.dataclass(frozen=True)
class Topology:
  """A TPU slice: its chip, its shape (chips per side) and the hosts (processes) that drive it. GPUs: the shape is
  (hosts, GPUs per host)."""

  chip: Chip
  shape: tuple[int, ...]
  given: str  # the name it was asked for

  @property
  def gpu(self) -> bool:
    return self.chip.platform != "tpu"

  @property
  def chips(self) -> int:
    return math.prod(self.shape)

  @property
  def jax_name(self) -> str:
    """jax's name of the topology: `v5p:2x2x2`; for GPUs `<partitions>x<hosts>x<GPUs per host>`."""
    if self.gpu:
      return f"1x{self.shape[0]}x{self.shape[1]}"
    return f"{self.chip.name}:{'x'.join(map(str, self.shape))}"

  @property
  def accelerator_type(self) -> str:
    return f"{self.chip.name}-{self.chips * self.chip.cores_per_chip}"

  @property
  def hosts_bounds(self) -> tuple[int, int, int]:
    """Chips per host along each side: one host for a 2-D slice of up to 8 chips, else a 2x2 block."""
    padded = (*self.shape, 1)[:3]
    if self.chip.dims == 2 and self.chips <= 8:
      return padded
    return tuple(min(s, b) for s, b in zip(padded, (2, 2, 1), strict=True))

  @property
  def hosts(self) -> int:
    if self.gpu:
      return self.shape[0]
    return self.chips // math.prod(self.hosts_bounds)

  def describe(self) -> str:
    plural = lambda n, word: f"{n} {word}{'s' if n > 1 else ''}"
    if self.gpu:
      return (f"{self.given}: {plural(self.chips, self.chip.device_kind + ' GPU')}, {plural(self.hosts, 'host')} of "
              f"{self.shape[1]}, {self.chip.usable_gib:.2f} GiB usable per GPU ({self.chip.usable_note})")
    return (f"{self.given}: {plural(self.chips, self.chip.name + ' chip')} ({self.jax_name}), "
            f"{plural(self.hosts, 'host')}, {self.chip.usable_gib:g} GiB usable HBM per chip")


def _standard_shape(chips: int, dims: int, given: str) -> tuple[int, ...]:
  if dims == 2 and chips == 1:
    return (1, 1)
  if chips < 4 or chips & (chips - 1):
    raise TopologyError(f"{given}: no standard slice of {chips} chips; give its shape as jax names it, e.g. "
                        f"{'v5p:4x4x12' if dims == 3 else 'v5e:4x8'}")
  shape = [2, 2, 1] if dims == 3 else [2, 2]
  while math.prod(shape) < chips:
    shape[shape.index(min(shape))] *= 2
    shape.sort()
  return tuple(shape)


def resolve(name: str) -> Topology:
  """The slice named `name` (see the module docstring); TopologyError says what was wrong."""
  text = name.strip().lower()
  m = re.fullmatch(r"([a-z0-9]+)-(\d+)", text)
  if m and m.group(1) in GPUS:
    gpu, count = GPUS[m.group(1)], int(m.group(2))
    if count < 1 or (count > gpu.per_host and count % gpu.per_host):
      raise TopologyError(f"{name}: {gpu.name} GPUs come {gpu.per_host} to a host: up to {gpu.per_host} on one, "
                          f"or a multiple of {gpu.per_host}")
    per_host = min(count, gpu.per_host)
    return Topology(gpu, (count // per_host, per_host), name)
  if m and m.group(1) in _ALIASES:
    chip = CHIPS[_ALIASES[m.group(1)]]
    count = int(m.group(2))
    if count % chip.cores_per_chip or not count:
      raise TopologyError(f"{name}: {chip.name} accelerator types count TensorCores, {chip.cores_per_chip} per chip: "
                          f"the number must be a positive multiple of {chip.cores_per_chip}")
    return Topology(chip, _standard_shape(count // chip.cores_per_chip, chip.dims, name), name)
  m = re.fullmatch(r"([a-z0-9]+):(\d+(?:x\d+)*)", text)
  if m and m.group(1) in _ALIASES:
    chip = CHIPS[_ALIASES[m.group(1)]]
    shape = tuple(int(s) for s in m.group(2).split("x"))
    if len(shape) != chip.dims or min(shape) < 1:
      raise TopologyError(f"{name}: a {chip.name} slice has {chip.dims} sides, e.g. "
                          f"{chip.name}:{'x'.join(['2'] * chip.dims)}")
    return Topology(chip, shape, name)
  raise TopologyError(f"unknown topology {name!r}: give {_EXAMPLES}")


def _spec(module: str) -> Any:
  """importlib's spec of `module`, or None when it (or a package above it) is not installed."""
  try:
    return importlib.util.find_spec(module)
  except (ImportError, ValueError):
    return None


def cuda_data_dir() -> str | None:
  """The nvidia-cuda-nvcc-cu12 wheel's folder (bin/ptxas inside), or None when it is not installed."""
  spec = _spec("nvidia.cuda_nvcc")
  folders = list(spec.submodule_search_locations or []) if spec else []
  found = [f for f in folders if os.path.isfile(os.path.join(f, "bin", "ptxas"))]
  return found[0] if found else None


def compile_options(topology: Topology) -> dict[str, Any]:
  """Options every compile for `topology` takes: for GPUs, ptxas from the nvidia-cuda-nvcc-cu12 wheel, named
  explicitly (not whatever CUDA toolkit the machine may have, or not have)."""
  if not topology.gpu:
    return {}
  folder = cuda_data_dir()
  return {"xla_gpu_cuda_data_dir": folder} if folder else {}


def _gpu_devices(topology: Topology) -> list[Any]:
  """jax's compile-only GPU devices (the CUDA plugin compiles for them on this CPU; no GPU, no driver)."""
  if _spec("jax_plugins.xla_cuda12") is None or cuda_data_dir() is None:
    raise TopologyError(f"{topology.given}: compiling for GPUs needs the CUDA plugin and ptxas: "
                        f"pip install {CUDA_PACKAGES} (requirements-test.txt)")
  from jax.experimental import topologies

  target = TARGET_CONFIGS[topology.chip.name].read_text()
  try:
    found = topologies.get_topology_desc(platform="cuda", target_config=target, topology=topology.jax_name).devices
  except RuntimeError as e:  # JaxRuntimeError
    raise TopologyError(f"{topology.given}: the CUDA plugin refused the topology {topology.jax_name}: "
                        f"{str(e).splitlines()[0]}") from None
  return _checked(found, topology, "the CUDA plugin")


def devices(topology: Topology) -> list[Any]:
  """jax's compile-only devices of the slice (no TPU needed: libtpu compiles for them on this CPU).

  libtpu, when it first loads, asks the TPU VM's metadata server what machine it runs on and logs warnings when
  there is none; naming the slice and this host beforehand (unless already set) keeps that quiet. It also takes a
  machine-wide lock (/tmp/libtpu_lockfile) that makes a second process loading it fail; compiling touches no TPU,
  so several such processes may run at once (jax's own multi-process tests allow it the same way)."""
  if topology.gpu:
    return _gpu_devices(topology)
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", topology.accelerator_type)
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies

  options: dict[str, Any] = {"chips_per_host_bounds": topology.hosts_bounds}
  if topology.chip.cores_per_chip > 1:
    options["chip_config_name"] = "megacore"  # one device per chip, as a TPU VM runs them
  try:
    found = topologies.get_topology_desc(platform="tpu", topology_name=topology.jax_name, **options).devices
  except RuntimeError as e:  # JaxRuntimeError: a shape libtpu does not know
    raise TopologyError(f"{topology.given}: libtpu refused the slice {topology.jax_name}: "
                        f"{str(e).splitlines()[0]}") from None
  return _checked(found, topology, "libtpu")


def _checked(found: Any, topology: Topology, maker: str) -> list[Any]:
  """The compile-only devices, checked against the slice's chip count and kind."""
  if len(found) != topology.chips or found[0].device_kind != topology.chip.device_kind:
    raise TopologyError(f"{topology.given}: {maker} made {len(found)} {found[0].device_kind} devices, expected "
                        f"{topology.chips} {topology.chip.device_kind}")
  return list(found)
