"""Plots of results computed elsewhere (data in, PNG out), so that the pure modules under rl_lm/rl/ import no
matplotlib. matplotlib is imported on first use, with the Agg backend: no display needed. `save` writes
and closes every figure of the project.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def save(fig: object, path: str | os.PathLike) -> Path:
  """Lays out `fig`, writes it to `path` as a PNG (creating the folder) and closes it; returns the path."""
  import matplotlib.pyplot as plt

  out = Path(path)
  out.parent.mkdir(parents=True, exist_ok=True)
  fig.tight_layout()
  fig.savefig(out, format="png")
  plt.close(fig)
  return out


def reliability_plot(bins_dict: dict[str, np.ndarray | float], path: str | os.PathLike, title: str | None = None
                     ) -> Path:
  """Reliability diagram of a `preference.calibration` result to a PNG: accuracy per bin over the diagonal,
  counts below."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  edges = np.asarray(bins_dict["rm/bin_edges"])
  conf = np.asarray(bins_dict["rm/bin_confidence"])
  acc = np.asarray(bins_dict["rm/bin_accuracy"])
  count = np.asarray(bins_dict["rm/bin_count"])
  centres, width = 0.5 * (edges[:-1] + edges[1:]), np.diff(edges)
  full = count > 0
  fig, (ax, ax_n) = plt.subplots(2, 1, figsize=(4.5, 5.5), dpi=100, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
  ax.bar(centres[full], acc[full], width=width[full], edgecolor="k", alpha=0.7, label="empirical frequency")
  ax.plot(conf[full], acc[full], "o", color="C3", ms=4, label="(mean predicted, frequency)")
  ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
  ax.set_ylim(0, 1)
  ax.set_ylabel("frequency")
  ax.legend(fontsize=7, loc="upper left")
  ece = f"ECE {float(bins_dict['rm/ece']):.4f}"
  ax.set_title(f"{title}: {ece}" if title else ece, fontsize=9)
  ax_n.bar(centres, count, width=width, edgecolor="k", color="C7")
  ax_n.set_xlabel("predicted probability")
  ax_n.set_ylabel("count")
  ax_n.set_xlim(0, 1)
  return save(fig, path)
