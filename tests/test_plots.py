"""Plots write a PNG; the pure modules under rl_lm/rl/ never import matplotlib."""

from pathlib import Path

import numpy as np

from rl_lm import plots
from rl_lm.rl import preference


def test_reliability_plot_writes_png(tmp_path):
  rng = np.random.default_rng(0)
  d = rng.normal(scale=2.0, size=500)  # [N] reward gaps
  cal = preference.calibration(5.0 * d, np.zeros_like(d), rng.random(500) < 1.0 / (1.0 + np.exp(-d)))
  out = plots.reliability_plot(cal, tmp_path / "rel" / "reliability.png", title="x5")
  assert out.exists() and out.stat().st_size > 1000


def test_rl_package_imports_no_plotting():
  rl_dir = Path(__file__).resolve().parents[1] / "rl_lm" / "rl"
  assert not [p.name for p in rl_dir.glob("*.py") if "matplotlib" in p.read_text()]
