"""The entry point end to end: the sample config's smoke variant runs on a mesh and writes its samples."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_sample_smoke_runs(tmp_path):
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  run = subprocess.run(
    [sys.executable, "-m", "rl_lm.main", "--config=configs/sample.py:smoke", f"--workdir={tmp_path}",
     "--config.sample.num_batches=2", "--config.mesh.data=2", "--config.mesh.tensor=4"],
    cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
  )
  assert run.returncode == 0, run.stderr[-2000:]
  assert "decode throughput" in run.stdout and "'data': 2" in run.stdout
  records = [json.loads(line) for line in open(tmp_path / "samples.jsonl")]
  assert len(records) == 2 * 8
  assert all(0 < r["length"] <= 8 and r["sum_logprob"] < 0 for r in records)
