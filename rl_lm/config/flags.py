"""One line that says which `--config.*` override was wrong, for an error config_flags raised."""

from __future__ import annotations

import ml_collections


def _load_config_file(spec: str) -> ml_collections.ConfigDict | None:
  """Loads `path[:arg]` the way config_flags does; None if that fails too."""
  import importlib.util

  path, _, arg = spec.partition(":")
  try:
    module_spec = importlib.util.spec_from_file_location("_rl_lm_config_probe", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()
  except Exception:  # noqa: BLE001 -- only used to explain another error
    return None


def explain_flag_error(argv: list[str], error: Exception) -> str:
  """One line saying which `--config.*` override was wrong, for an error raised while parsing flags."""
  spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  config = _load_config_file(spec) if spec else None
  if config is not None:
    for a in argv:
      if not a.startswith("--config."):
        continue
      path = a[len("--config."):].split("=", 1)[0]
      node, walked = config, "config"
      for part in path.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
          known = ", ".join(sorted(node.keys())) if isinstance(node, ml_collections.ConfigDict) else "(not a section)"
          return f"config.{path}: unknown key {part!r} under {walked}; known keys: {known}"
        node, walked = node[part], f"{walked}.{part}"
  message = str(error).removeprefix("flag ")
  if "Traceback" in message:  # an exception inside the config file: keep its last line
    last = [ln for ln in message.splitlines() if ln.strip()][-1]
    return f"{spec}: {last}"
  return message if "--config" in message or not spec else f"{message} (while applying --config overrides)"
