"""The pod-scale table (experiments/pod_scale/run.py): its mesh rule, its rows and its cache; no compiles."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.pod_scale import run
from rl_lm.aot import chips
from rl_lm.models import presets


def test_the_mesh_rule():
  # Qwen2.5-7B: 28 query and 4 KV heads, so tensor parallelism over 4 chips of a host, data over the rest.
  assert run.meshes(8, presets.get("qwen2.5-7b")) == [(2, 1, 4), (1, 2, 4), (1, 8, 1)]
  assert run.meshes(256, presets.get("llama-3.1-8b")) == [(32, 1, 8), (1, 32, 8), (1, 256, 1)]
  # Under 3B parameters: FSDP over a host, data across hosts; a slice of 4 chips is one host.
  assert run.meshes(64, presets.get("qwen2.5-0.5b")) == [(8, 8, 1), (1, 64, 1), (32, 1, 2)]
  assert run.meshes(4, presets.get("qwen2.5-1.5b")) == [(1, 4, 1), (2, 1, 2)]  # 2 KV heads: tensor over 2


def test_a_first_mesh_whose_state_takes_30_percent_of_a_chip_is_compiled_memory_only_first(tmp_path: Path, monkeypatch):
  v5e = chips.resolve("v5e-8").chip  # 15.75 GiB usable
  # Qwen2.5-32B, GRPO over tensor 8: 16 bytes x 32.8B parameters / 8 chips = 66 GB a chip.
  assert run.unlikely(presets.get("qwen2.5-32b"), "grpo", v5e, (1, 1, 8))
  # Llama-3.1-8B with LoRA: the float32 base alone, 4 x 8.0B / 8 = 4.0 GB.
  assert not run.unlikely(presets.get("llama-3.1-8b"), "lora", v5e, (1, 1, 8))
  # Data parallelism does not share the state: every chip holds all of Qwen2.5-1.5B's, 25 GB.
  assert run.unlikely(presets.get("qwen2.5-1.5b"), "grpo", v5e, (8, 1, 1))
  # Either side of the line, on v5p-8 over tensor 4 (95.74 GiB usable): Qwen2.5-7B GRPO, 0.297 of a chip, and
  # Llama-3.1-8B GRPO, 0.313.
  v5p = chips.resolve("v5p-8").chip
  assert not run.unlikely(presets.get("qwen2.5-7b"), "grpo", v5p, (1, 1, 4))
  assert run.unlikely(presets.get("llama-3.1-8b"), "grpo", v5p, (1, 1, 4))
  calls = []

  def aot(cmd: list[str], folder: Path, reuse: bool = False) -> dict:
    calls.append("--nocost" in cmd)
    return {"fits": True, "refusal": None, "programs": []}

  monkeypatch.setattr(run, "_aot", aot)
  c = run.cell("qwen2.5-32b", "grpo", "v5e-8", tmp_path)
  assert calls == [True, False]  # memory-only, then the same mesh with costs
  assert c["mesh"] == (1, 1, 8) and "--nocost" not in c["command"]
  calls.clear()
  run.cell("llama-3.1-8b", "lora", "v5e-8", tmp_path)
  assert calls == [False]  # with costs at once


def test_a_cell_kept_from_an_earlier_costing_is_costed_again_on_its_mesh_alone(tmp_path: Path, monkeypatch):
  calls = []

  def aot(cmd: list[str], folder: Path, reuse: bool = False) -> dict:
    calls.append([a for a in cmd if a.startswith("--config.mesh") or a == "--nocost"])
    return {"fits": True, "refusal": None, "programs": [], "new": True}

  monkeypatch.setattr(run, "_aot", aot)
  old = {"model": "llama-3.1-8b", "recipe": "grpo", "topology": "v5p-64", "chips": 32, "seconds": 340.0,
         "tried": [{"mesh": [4, 1, 8], "fits": True, "refusal": None}], "mesh": [4, 1, 8],
         "record": {"fits": True, "programs": []}, "command": "python -m rl_lm.aot ..."}
  refused = {**old, "topology": "v5e-8", "mesh": [1, 8, 1], "record": {"fits": False, "programs": []}}
  for kept in (old, refused):
    path = run._done(tmp_path, kept["model"], kept["recipe"], kept["topology"])
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(kept))
  assert not run.current(old) and run.current(refused)  # a refusal does not depend on the costing
  c = run.cell("llama-3.1-8b", "grpo", "v5p-64", tmp_path)
  # One compile, with costs, on the mesh it fitted with; no search.
  assert calls == [["--config.mesh.data=4", "--config.mesh.fsdp=1", "--config.mesh.tensor=8"]]
  assert c["record"]["new"] and c["costing"] == run.COSTING and c["searched_before"] == 340.0
  assert run.current(json.loads(run._done(tmp_path, "llama-3.1-8b", "grpo", "v5p-64").read_text()))
  calls.clear()
  run.cell("llama-3.1-8b", "grpo", "v5p-64", tmp_path)
  run.cell("llama-3.1-8b", "grpo", "v5e-8", tmp_path)
  assert calls == []  # both stand as kept now


def test_a_ppo_cell_kept_from_before_the_chunked_reward_scoring_is_searched_again(tmp_path: Path, monkeypatch):
  calls = []

  def aot(cmd: list[str], folder: Path, reuse: bool = False) -> dict:
    calls.append(([a for a in cmd if a.startswith("--config.mesh")], list(folder.parent.parent.glob("mesh_*"))))
    return {"fits": True, "refusal": None, "programs": [], "new": True}

  monkeypatch.setattr(run, "_aot", aot)
  base = {"topology": "v5p-8", "chips": 4, "seconds": 90.0, "tried": [], "mesh": [1, 4, 1], "costing": 2,
          "command": "python -m rl_lm.aot ..."}
  ppo = {**base, "model": "qwen2.5-1.5b", "recipe": "ppo", "record": {"fits": False, "programs": []}}
  grpo = {**base, "model": "qwen2.5-1.5b", "recipe": "grpo", "record": {"fits": True, "programs": []}}
  for kept in (ppo, grpo):
    path = run._done(tmp_path, kept["model"], kept["recipe"], kept["topology"])
    (path.parent / "mesh_1x4x1" / "memory").mkdir(parents=True)  # an old record of the search
    path.write_text(json.dumps(kept))
  # The reward scoring's memory changed for PPO only: a refusal of PPO too is stale, GRPO's cell stands.
  assert run.stale(ppo) == "memory" and run.stale({**ppo, "record": {"fits": True}}) == "memory"
  assert run.stale(grpo) is None and run.stale({**grpo, "costing": 1}) == "cost"
  assert run.stale({**grpo, "costing": 1, "record": {"fits": False}}) is None
  c = run.cell("qwen2.5-1.5b", "ppo", "v5p-8", tmp_path)
  # A search from the first mesh of the rule, none of the old records left to reuse.
  assert calls[0] == (["--config.mesh.data=1", "--config.mesh.fsdp=4", "--config.mesh.tensor=1"], [])
  assert c["record"]["new"] and c["costing"] == run.COSTING and run.current(c)
  calls.clear()
  run.cell("qwen2.5-1.5b", "grpo", "v5p-8", tmp_path)
  assert calls == []
  row = run.row({**ppo, "record": {"fits": False, "refusal": "rl_lm.aot: does not fit: ...", "programs": []}})
  assert row[4] == "compiled before the rollout's reward was scored in row chunks†"


def test_a_memory_only_record_left_by_an_interrupted_table_is_reused_a_costed_one_is_not(tmp_path: Path):
  import sys

  kept = {"fits": False, "refusal": "rl_lm.aot: does not fit: ...", "programs": []}
  (tmp_path / "aot_v6e-8.json").write_text(json.dumps(kept))
  nothing = [sys.executable, "-c", "pass"]  # a command that writes no record
  assert run._aot(nothing, tmp_path, reuse=True) == kept
  assert run._aot(nothing, tmp_path) is None and not list(tmp_path.glob("aot_*.json"))  # compiled afresh


def _program(function: str, seconds: float | None = None, basis: str = "xla", why: str | None = None,
             **extra: float) -> dict:
  cost = {"seconds": seconds, "seconds_basis": basis} if seconds else None
  out = {"function": function, "analytic": {"why": why}, "memory": {"needed": 20 * 2**30}, **extra}
  return {**out, "cost_per_chip": cost} if cost else out


def _cell(programs: list[dict], fits: bool = True, refusal: str | None = None) -> dict:
  return {"model": "qwen2.5-0.5b", "recipe": "grpo", "topology": "v5e-8", "chips": 8, "mesh": [1, 8, 1],
          "command": "python -m rl_lm.aot ...", "costing": run.COSTING,
          "record": {"fits": fits, "refusal": refusal, "chip": {"usable_gib": 15.75}, "programs": programs}}


def test_a_row_shows_the_estimates_of_a_cell_that_fits():
  programs = [_program("rl/generate", 3.03), _program("rl/prepare", 0.5, basis="roofline"),
              _program("rl/update", 1.25, mfu=0.444),
              _program("rl/generate:decode", 2e-3, tokens_per_s=256_000.0, x_roofline=1.65)]
  row = run.row(_cell(programs))
  assert row[:4] == ["qwen2.5-0.5b", "v5e-8 (8)", "yes", "20.0 / 15.75"]
  assert row[4] == "generate 3.03; prepare 0.5 (roofline); update 1.25"
  assert row[5:] == ["44.4%", "256,000 (1.65x roofline)", "1x8x1"]


def test_a_cell_costed_the_earlier_way_is_marked_until_it_is_costed_again(tmp_path: Path):
  programs = [_program("rl/generate", 3.03), _program("rl/update", 1.25, mfu=0.444)]
  old = {**_cell(programs), "costing": 1}
  assert run.row(old)[4] == "generate 3.03; update 1.25; costed the earlier way*"
  assert "Costed the earlier way" in run.report([old, _cell(programs)], tmp_path)
  assert "Costed the earlier way" not in run.report([_cell(programs)], tmp_path)


def test_a_row_shows_a_flagged_decode_step_by_its_bound_alone():
  """Counts that disagree with the analytic FLOPs give no time: the row says flagged, and the decode column gives
  the HBM roofline (weights and cache read once a step) as the only figure."""
  why = "flagged: XLA counts 2.05x the analytic FLOPs"
  programs = [_program("rl/generate", why=why), _program("rl/update", 1.25, mfu=0.3),
              _program("rl/generate:decode", why=why, tokens=512, roofline_seconds=1.134e-3)]
  row = run.row(_cell(programs))
  assert row[4] == "generate flagged; update 1.25"
  assert row[6] == "flagged (the HBM roofline: 451,499)"


def test_a_row_of_a_cell_that_does_not_fit_shows_the_refusal_and_no_estimate():
  refusal = "rl_lm.aot: does not fit: rl/generate needs 32.2 GiB per chip of 15.75 GiB (v5e): try model.lora.rank=16"
  row = run.row(_cell([_program("rl/generate", 3.0), _program("rl/update", 1.0, mfu=0.5)], False, refusal))
  assert row[2] == "no: does not fit: rl/generate needs 32.2 GiB per chip of 15.75 GiB (v5e): try model.lora.rank=16"
  assert row[4:] == ["-", "-", "-", "-"]


def test_the_report_is_rebuilt_from_the_cells_kept(tmp_path: Path, capsys):
  """`--report` compiles nothing: it reads each <cell>/cell.json there is, in the grid's order."""
  for model in ("qwen2.5-1.5b", "qwen2.5-0.5b"):
    cell = {**_cell([_program("rl/update", 1.0, mfu=0.5)]), "model": model}
    folder = tmp_path / f"{model}__v5e-8__grpo"
    folder.mkdir()
    (folder / "cell.json").write_text(json.dumps(cell))
  assert run.main(["--workdir", str(tmp_path), "--report"]) == 0
  table = (tmp_path / "pod_scale.md").read_text()
  assert table.startswith("### GRPO (policy + reference)")
  assert table.index("| qwen2.5-0.5b |") < table.index("| qwen2.5-1.5b |")
  assert "### PPO" not in table and "50.0%" in table
  assert [c["model"] for c in json.loads((tmp_path / "pod_scale.json").read_text())] == \
      ["qwen2.5-0.5b", "qwen2.5-1.5b"]
