"""The code base stays ruff clean (lint and import order), as CI checks through the test command."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
  ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
  if not Path(ruff).exists():
    pytest.skip("ruff not installed")
  run = subprocess.run([ruff, "check", "rl_lm", "configs", "tests", "experiments", "launch"], cwd=ROOT,
                       capture_output=True, text=True)
  assert run.returncode == 0, run.stdout + run.stderr
