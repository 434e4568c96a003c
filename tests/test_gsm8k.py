"""GSM8K loading (JSONL and TFDS), gold answers, templates, and the acceptance check on the test set."""

from __future__ import annotations

import json
import re
import sys
import types

import pytest

from rl_lm.rewards.audit import change_final_number
from rl_lm.rewards.maths import MathsReward
from rl_lm.tasks.base import DataError
from rl_lm.tasks.gsm8k import (
  TEMPLATES,
  GSM8KTask,
  get_template,
  gold_answer,
  load_gsm8k,
  strip_annotations,
  to_ascii,
)
from rl_lm.tokenizer import CharTokenizer


def test_gold_answer_is_the_number_after_hashes():
  assert gold_answer("She makes 9 * 2 = $<<9*2=18>>18.\n#### 18") == "18"
  assert gold_answer("...\n#### 1,600") == "1600"
  assert gold_answer("#### -3") == "-3"
  with pytest.raises(ValueError):
    gold_answer("no marker")


def test_annotations_and_ascii():
  assert strip_annotations("48/2 = <<48/2=24>>24 clips") == "48/2 = 24 clips"
  assert to_ascii("Janet\u2019s 3\u00d74 \u20ac5") == "Janet's 3x4 EUR 5"


def test_templates_are_selectable():
  assert set(TEMPLATES) >= {"plain", "chat"}
  assert "{question}" in get_template("plain").prompt
  assert get_template("Q: {question}\nA:").prompt == "Q: {question}\nA:"
  with pytest.raises(ValueError, match="known"):
    get_template("nonsense")


def test_jsonl_loading_and_problems():
  records = load_gsm8k("test", source="jsonl")
  assert len(records) == 1319
  task = GSM8KTask(template="chat")
  problems = task.test_problems()
  assert len(problems) == 1319 and len({p.id for p in problems}) == 1319
  p = problems[0]
  assert p.answer == "18" and p.task == "gsm8k"
  # A chat prompt is the user turn's text: the question, then the answer format; no model's turn markers.
  assert p.prompt.startswith(p.metadata["question"]) and "####" in p.prompt and "<|" not in p.prompt
  assert p.reference.rstrip().endswith("#### 18") and "<<" not in p.reference
  assert any("," not in q.answer and len(q.answer) >= 4 for q in problems)
  assert all("," not in q.answer for q in problems)


def test_train_stream_is_seeded_and_ascii_option_fits_char_tokenizer():
  task = GSM8KTask(ascii_text=True)
  a = [p.id for p in task.train_problems(50, seed=1)]
  assert a == [p.id for p in task.train_problems(50, seed=1)]
  assert a != [p.id for p in task.train_problems(50, seed=2)]
  tok = CharTokenizer()
  for p in task.test_problems(200):
    tok.encode(p.prompt + p.reference)


def test_tfds_source_reads_a_prepared_builder(monkeypatch):
  rows = [{"question": b"What is 2+2?", "answer": b"2+2=4\n#### 4", "annotation": b"", "short_answer": b"4"}]
  calls = {}

  def data_source(name, split, data_dir, download):
    calls.update(name=name, split=split, data_dir=data_dir, download=download)
    return rows

  monkeypatch.setitem(sys.modules, "tensorflow_datasets", types.SimpleNamespace(data_source=data_source))
  records = load_gsm8k("test", source="tfds", data_dir="/some/tfds")
  assert records == [{"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}]
  assert calls == {"name": "gsm8k", "split": "test", "data_dir": "/some/tfds", "download": False}
  task = GSM8KTask(source="tfds", data_dir="/some/tfds")
  assert task.test_problems()[0].answer == "4"


def test_missing_jsonl_is_reported(tmp_path):
  with pytest.raises(FileNotFoundError):
    load_gsm8k("test", source="jsonl", data_dir=tmp_path)


GOOD = json.dumps({"question": "What is 2+2?", "answer": "2+2=4\n#### 4"})


@pytest.mark.parametrize(("line", "message"), [
  ('{"question": "x", "answer": ', "test.jsonl:3: not valid JSON (Expecting value at column 29)"),
  ('["question", "answer"]', "test.jsonl:3: expected a JSON object, got list"),
  ('{"question": "x"}', "test.jsonl:3: missing field 'answer' (each line needs 'question', 'answer')"),
  ('{"question": "x", "answer": 4}', "test.jsonl:3: field 'answer' must be a string, got int"),
  ('{"question": "x", "answer": "4"}', "test.jsonl:3: field 'answer' has no '#### <number>' final answer"),
])
def test_a_bad_line_is_named_by_file_and_line(tmp_path, line, message):
  (tmp_path / "test.jsonl").write_text(GOOD + "\n\n" + line + "\n")  # line 2 is blank: still counted
  with pytest.raises(DataError) as e:
    load_gsm8k("test", source="jsonl", data_dir=tmp_path)
  assert str(e.value) == f"{tmp_path}/{message}" and e.value.user_facing


def test_an_empty_or_undecodable_file_is_named(tmp_path):
  (tmp_path / "train.jsonl").write_text("\n")
  with pytest.raises(DataError, match=f"^{re.escape(str(tmp_path))}/train.jsonl holds no problems$"):
    next(GSM8KTask(data_dir=tmp_path).train_problems(1))
  (tmp_path / "test.jsonl").write_bytes(GOOD.encode() + b"\n" + b'{"question": "\xff"}\n')
  with pytest.raises(DataError) as e:
    load_gsm8k("test", source="jsonl", data_dir=tmp_path)
  assert str(e.value) == f"{tmp_path}/test.jsonl:2: not UTF-8 text (byte 0xff at column 15)"


def test_all_test_references_score_one_and_changed_answers_zero():
  """Acceptance: 1,319/1,319 references score 1; with the final number changed, 0/1,319."""
  problems = GSM8KTask().test_problems()
  reward = MathsReward()
  good = reward.batch(problems, [p.reference for p in problems])
  bad = reward.batch(problems, [change_final_number(p.reference, p.answer) for p in problems])
  assert all(r.valid for r in good + bad)
  assert sum(r.score for r in good) == 1319
  assert sum(r.score for r in bad) == 0
