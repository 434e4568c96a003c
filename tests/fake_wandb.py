"""A stand-in for the `wandb` package in tests: it records `init`, `log` and `finish` calls, starts no service
and writes no W&B files.

In-process, the `fake_wandb` fixture of tests/test_metrics.py loads this file as `sys.modules["wandb"]`; its
calls are in `calls`. For a subprocess, copy it as `wandb.py` into a folder put first on PYTHONPATH and name a
file in `RL_LM_FAKE_WANDB_LOG`: every call is also appended there as one JSON line (NaN and infinities as
JSON's `NaN` / `Infinity`, which `json.loads` reads), `{"call": "init", "run": id, "kwargs": {...}}`,
`{"call": "log", "run": id, "step": s, "data": {...}}` or `{"call": "finish", "run": id}`.

Only what rl_lm uses is faked: `init(**kwargs)` (every keyword recorded; `id` is kept when given, as a
resumed run does) and a run's `id`, `name`, `project`, `config`, `log(data, step=...)` and `finish()`.
`tests/test_metrics.py` checks the recorded keywords against the real `wandb.init`'s signature.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from typing import Any

calls: list[dict[str, Any]] = []


def _record(call: dict[str, Any]) -> None:
  calls.append(call)
  path = os.environ.get("RL_LM_FAKE_WANDB_LOG")
  if path:
    with open(path, "a") as f:
      f.write(json.dumps(call) + "\n")


class Run:
  """What `init` returns."""

  def __init__(self, id: str, name: str | None, project: str | None, config: Mapping[str, Any] | None) -> None:
    self.id, self.name, self.project = id, name, project
    self.config = dict(config or {})
    self.finished = False

  def log(self, data: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
    if self.finished:
      raise RuntimeError(f"fake wandb: log() on finished run {self.id}")
    _record({"call": "log", "run": self.id, "step": step, "data": dict(data)})

  def finish(self, exit_code: int | None = None) -> None:
    self.finished = True
    _record({"call": "finish", "run": self.id})


def init(**kwargs: Any) -> Run:
  if kwargs.get("mode") not in (None, "online", "offline", "disabled", "shared"):
    raise ValueError(f"fake wandb: bad mode {kwargs['mode']!r}")
  if kwargs.get("dir") is not None and not os.path.isdir(kwargs["dir"]):
    raise ValueError(f"fake wandb: dir {kwargs['dir']!r} does not exist")
  run = Run(kwargs.get("id") or secrets.token_hex(4), kwargs.get("name"), kwargs.get("project"), kwargs.get("config"))
  _record({"call": "init", "run": run.id, "kwargs": kwargs})
  return run
