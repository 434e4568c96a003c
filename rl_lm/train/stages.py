"""The stages a run can chain (`config.stages`), by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rl_lm.train import sample

STAGES: dict[str, Callable[[Any, str], None]] = {
  "sample": sample.run,
}
