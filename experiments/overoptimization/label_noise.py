"""Reward-model accuracy against label noise on the synthetic preference task:

  python -m experiments.overoptimization.label_noise --workdir=/tmp/rl_lm/label_noise [--noise=0,0.1,0.2,0.3]
      [--seeds=0] [--sft=DIR/checkpoints/sft]

Trains `configs/rlhf_ppo.py`'s reward model once per (noise, seed), every time from the same SFT
checkpoint (made first in <workdir>/sft unless --sft names one), and prints held-out accuracy against
the noisy labels, against the gold ordering, and the calibration error, as a Markdown table (also
written to <workdir>/label_noise.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from experiments.overoptimization.run import _main


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--noise", default="0,0.1,0.2,0.3")
  parser.add_argument("--seeds", default="0")
  parser.add_argument("--sft", default="", help="an SFT checkpoint folder; default: train one in <workdir>/sft")
  args = parser.parse_args()
  workdir = Path(args.workdir)
  sft = Path(args.sft) if args.sft else workdir / "sft" / "checkpoints" / "sft"
  if not args.sft:
    _main(workdir / "sft", "--config.stages=('sft',)")
  rows = []
  for seed in [int(s) for s in args.seeds.split(",")]:
    for noise in [float(x) for x in args.noise.split(",")]:
      run = workdir / f"noise{noise:g}_seed{seed}"
      print(f"label_noise: reward model with label noise {noise:g}, seed {seed} in {run}", flush=True)
      _main(run, "--config.stages=('reward_model',)", f"--config.reward_model.init_from={sft}",
            f"--config.preferences.label_noise={noise}", f"--config.seed={seed}")
      after = json.loads((run / "reward_model_summary.json").read_text())["after"]
      rows.append((noise, seed, after))
  lines = ["| label noise | seed | labels agreeing with gold | accuracy vs labels | accuracy vs gold | ECE |",
           "| --- | --- | --- | --- | --- | --- |"]
  for noise, seed, a in rows:
    lines.append(f"| {noise:g} | {seed} | {a['rm_eval/label_agreement_with_gold']:.3f} | {a['rm_eval/accuracy']:.3f} | "
                 f"{a['rm_eval/gold_accuracy']:.3f} | {a['rm_eval/ece']:.3f} |")
  table = "\n".join(lines)
  (workdir / "label_noise.md").write_text(table + "\n")
  print(table)


if __name__ == "__main__":
  main()
