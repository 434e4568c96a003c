"""rl_lm: JAX-native reinforcement-learning post-training of language models."""

import os as _os

__version__ = "0.1.0"

# XLA:CPU's concurrency-optimised scheduler can deadlock programs whose collectives have no data dependency
# between them when several CPU devices run in one process (fake devices: tests, local multi-process runs):
# the device threads enter the all-reduces in different orders and wait for each other until XLA aborts.
# Serialising them costs nothing measurable here and the flag only affects CPU compilation. It is read when
# the backend starts, so it must be in XLA_FLAGS before the first JAX computation.
_SERIAL_CPU_COLLECTIVES = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
if "xla_cpu_enable_concurrency_optimized_scheduler" not in _os.environ.get("XLA_FLAGS", ""):
  _os.environ["XLA_FLAGS"] = f"{_os.environ.get('XLA_FLAGS', '')} {_SERIAL_CPU_COLLECTIVES}".strip()
