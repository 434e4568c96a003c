"""Constitutional AI's supervised stage (rl_lm/train/constitution.py): the principles' checks by hand, a bad
constitution refused naming the key, and the stage end to end on the tiny model (transcripts written once and read
back, SFT on the revisions, compliance measured before and after)."""

import json

import pytest

from configs import cai_smollm2
from rl_lm import config as config_lib
from rl_lm.config.section import ConfigError
from rl_lm.train import constitution
from rl_lm.train.source import task_from_config
from tests.test_rl_loop import make_ctx


def test_the_checks_by_hand():
  by_name = {p.name: p for p in constitution.load_constitution()}
  last, brief, plain = by_name["answer_last_line"], by_name["brief"], by_name["no_hedging"]
  assert constitution.complies(last, "79 + 87 = 166\n166")
  assert constitution.complies(last, "166.") and constitution.complies(last, "-3.5")
  assert not constitution.complies(last, "The answer is 166.")
  assert not constitution.complies(last, "166\nHope that helps!")
  assert not constitution.complies(last, "")
  assert constitution.complies(brief, "The answer is 166.") and brief.n == 12
  assert not constitution.complies(brief, " ".join(["word"] * 13))
  assert not constitution.complies(plain, "I think it is 166.") and not constitution.complies(plain, "Maybe 166")
  assert constitution.complies(plain, "It is 166.")
  assert constitution.names(last, "It should END WITH the number.") and not constitution.names(last, "Looks fine.")
  rates = constitution.compliance([last, brief, plain], ["166", "I think it is 166", "The answer is 166."])
  assert rates["cai/compliance/answer_last_line"] == pytest.approx(1 / 3)
  assert rates["cai/compliance/brief"] == 1.0
  assert rates["cai/compliance/no_hedging"] == pytest.approx(2 / 3)
  assert rates["cai/compliance_all"] == pytest.approx(1 / 3)


def test_a_bad_constitution_is_refused_naming_the_key(tmp_path):
  bad = tmp_path / "c.json"
  bad.write_text(json.dumps([{"name": "x", "principle": "p", "critique": "c", "revision": "r", "check": "nope"}]))
  with pytest.raises(ConfigError, match="config.cai.constitution: .*unknown check 'nope'"):
    constitution.load_constitution(str(bad))
  bad.write_text("[{")
  with pytest.raises(ConfigError, match="config.cai.constitution: .*not a readable JSON"):
    constitution.load_constitution(str(bad))
  config = cai_smollm2.get_config("smoke")
  config.cai.constitution = str(tmp_path / "missing.json")
  with pytest.raises(ConfigError, match="config.cai.constitution: no such file"):
    config_lib.validate(config, num_devices=1)


def test_the_stage_writes_transcripts_trains_on_revisions_and_measures_compliance(tmp_path):
  config = cai_smollm2.get_config("smoke")
  config_lib.validate(config, num_devices=1)
  ctx = make_ctx(config, (1, 1, 1), str(tmp_path / "run"))
  lines: list[str] = []
  summary = constitution.train(ctx, task_from_config(config), lines.append)
  records = [json.loads(line) for line in open(tmp_path / "run" / constitution.TRANSCRIPTS)]
  assert len(records) == summary["transcripts"] == config.cai.prompts
  names = {p.name for p in constitution.load_constitution()}
  for r in records:
    assert r["principle"] in names and r["answer"] is not None
    assert (r["critique_names"] is None) == (r["critique"] is None or r["answer_complies"])
  assert summary["revisions"] + summary["unencodable"] == sum(bool(r["revision"]) for r in records)
  assert summary["revisions"] > 0
  assert set(summary["before"]) == set(summary["after"]) == {f"cai/compliance/{n}" for n in names} | {
    "cai/compliance_all"}
  assert (tmp_path / "run" / "cai_sft_metrics.jsonl").exists()
  assert any(line.startswith("cai_sft: compliance on held-out prompts, before -> after") for line in lines), lines
  saved = json.loads((tmp_path / "run" / "cai_summary.json").read_text())
  assert saved["before"] == summary["before"]
  again = constitution.transcripts(ctx, [], [], lambda line: pytest.fail(f"sampled again: {line}"))
  assert again == records
