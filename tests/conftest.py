"""Every test sees 8 fake CPU devices, so sharding is tested without hardware."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
import rl_lm  # noqa: E402,F401 -- adds the XLA:CPU flag that keeps multi-device collectives from deadlocking
