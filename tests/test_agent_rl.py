"""Multi-turn environments through the RL loop (rl_lm/train/agent.py): an environment written only against the
documented interface (rl_lm/envs/base.py) trains unchanged; environment failures, real or injected, are masked
from the gradient and counted, and the classifier finds the injected ones."""

from __future__ import annotations

import dataclasses
import os

import jax
import ml_collections
import numpy as np
import pytest

from configs import calculator
from rl_lm.envs import base, episodes, failures
from rl_lm.train.rl import RLTrainer
from tests.test_rl_loop import make_ctx, record


@base.register("test_agent_digits")
class DigitsEnv(base.Environment):
  """Two turns; each scores the share of digits in the policy's turn, so a random policy's groups have signal.
  The buggy variant raises on the first step of problems whose prompt ends in an odd digit ("an environment
  bug"); BUGGY is set by a test."""

  BUGGY = False

  def reset(self, problem, rng):
    self.problem, self.turns = problem, 0
    return problem.prompt

  def step(self, action):
    self.turns += 1
    if self.BUGGY and int(self.problem.prompt.rstrip("=")[-1]) % 2:
      raise RuntimeError("environment bug")
    score = sum(c.isdigit() for c in action) / max(len(action), 1)
    done = self.turns >= 2
    return base.Step("" if done else "again:", score, done, {"success": score > 0.5})


def agent_config(env: str = "test_agent_digits", workers: int = 0) -> ml_collections.ConfigDict:
  config = calculator.get_config("smoke")
  config.task.name = "arithmetic"
  config.task.levels = (1,)
  config.env.name = env
  config.env.workers = workers
  config.env.turn_tokens = 6
  config.env.max_tokens = 32
  config.env.max_turns = 3
  config.rl.prompts_per_step = 8
  config.rl.group_size = 4
  config.rl.learning_rate = 1e-3
  return config


STOPS = tuple(range(2, 40))  # eos and 37 characters: the random test model ends most turns within a few tokens


def trainer_for(config, tmp_path) -> RLTrainer:
  trainer = RLTrainer(make_ctx(config, (1, 1, 1), str(tmp_path)), log=lambda *_: None)
  runner = trainer.source.agent.train
  runner.scfg = dataclasses.replace(runner.scfg, stop_tokens=STOPS)
  return trainer


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
  trainer = trainer_for(agent_config(), tmp_path_factory.mktemp("agent"))
  yield trainer
  trainer.source.agent.close()


def test_a_foreign_environment_trains_through_the_unchanged_update(trainer):
  before = jax.device_get(trainer.state.policy.params)
  rec = record(trainer, 1)
  rollout = rec.batch.device
  obs = np.asarray(rollout.prompt_mask)
  assert not rec.data["mask"][obs].any(), "an observation token reached the loss"
  assert np.array_equal(rec.data["mask"], np.asarray(rollout.completion_mask) & rec.batch.host.valid[:, None])
  assert (rec.data["advantages"][obs] == 0).all()
  assert rec.metrics["episodes/turns_mean"] > 1.5  # most episodes took their second turn
  assert rec.metrics["episodes/failure_env"] == 0.0
  assert ((rec.batch.host.scores >= 0) & (rec.batch.host.scores <= 2)).all()  # two turns of a digit share each
  moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), before, rec.params))
  assert max(moved) > 0, "the update did not change the policy"


def test_environment_failures_are_masked_not_scored(trainer, monkeypatch):
  monkeypatch.setattr(DigitsEnv, "BUGGY", True)
  rec = record(trainer, 2)
  env_failed = np.asarray([s.startswith("environment") for s in rec.batch.host.statuses])
  assert env_failed.any() and not env_failed.all()
  assert not rec.batch.host.valid[env_failed].any() and rec.batch.host.valid[~env_failed].all()
  assert not rec.data["mask"][env_failed].any() and (rec.data["advantages"][env_failed] == 0).all()
  assert rec.metrics["episodes/failure_env"] == pytest.approx(env_failed.mean())
  assert all("environment bug" in s for s in np.asarray(rec.batch.host.statuses)[env_failed])


def test_an_episode_step_makes_every_transfer_explicit(trainer):
  """As `test_rl_loop.py`'s GRPO step: after a first step (compiles, first placements), a step of episodes runs
  under jax.transfer_guard("disallow"): the runner's observations, flags and budgets are placed explicitly."""
  trainer.train_step(3)
  with jax.transfer_guard("disallow"):
    metrics = trainer.train_step(4)
  assert np.isfinite(metrics["train/loss"]) and metrics["episodes/turns_mean"] >= 1


@pytest.mark.slow
def test_injected_faults_are_found_and_killed_workers_replaced(tmp_path):
  config = agent_config(workers=2)
  config.env.step_timeout_s = 1.0
  config.env.faults.crash, config.env.faults.hang, config.env.faults.slow = 0.08, 0.06, 0.06
  trainer = trainer_for(config, tmp_path)
  try:
    flagged = []
    for step in (1, 2):
      rec = record(trainer, step)
      flagged += [s.startswith("environment") for s in rec.batch.host.statuses]
      assert rec.metrics["faults/precision"] >= 0.95 and rec.metrics["faults/recall"] >= 0.95, rec.metrics
      env_failed = np.asarray([s.startswith("environment") for s in rec.batch.host.statuses])
      assert not rec.data["mask"][env_failed].any()
    assert sum(flagged) > 0 and trainer.source.agent.envs.stats["replaced"] > 0
    # A worker killed from outside between steps: replaced before the next batch, its episodes masked.
    os.kill(trainer.source.agent.envs.health()[0]["pid"], 9)
    rec = record(trainer, 3)
    assert rec.metrics["faults/recall"] >= 0.95
    assert all(h["alive"] for h in trainer.source.agent.envs.health())
  finally:
    trainer.source.agent.close()


def test_fault_plan_is_a_fixed_draw_at_the_configured_rates():
  faults = ml_collections.ConfigDict({"crash": 0.1, "hang": 0.05, "slow": 0.05})
  from rl_lm.train.agent import FaultPlan

  plan = FaultPlan(faults, seed=3)
  labels = plan(range(20000), 0)
  assert labels == plan(range(20000), 0)
  rates = {k: labels.count(k) / len(labels) for k in ("crash", "hang", "slow", "")}
  assert abs(rates["crash"] - 0.1) < 0.01 and abs(rates["hang"] - 0.05) < 0.01 and abs(rates["slow"] - 0.05) < 0.01


def test_calculator_episode_scoring():
  from rl_lm.envs.calculator import CalculatorEnv
  from rl_lm.tasks.products import ProductsTask

  p = ProductsTask().make_problem(347, 862)
  env = CalculatorEnv()
  assert env.reset(p, np.random.default_rng(0)) == "347*862="
  step = env.step("[calc(347*862)]")
  assert step == base.Step("299114\n", 0.0, False, {"tool_calls": 1, "tool_error": False})
  assert env.step(" 299114 ").reward == 1.0
  for wrong in ("-299114", "299114.0", "299114 or 299115", "[calc(1+1)] 299114", "2991140"):
    env.reset(p, np.random.default_rng(0))
    out = env.step(wrong)
    assert out.reward == 0.0 and out.done, wrong
  env.reset(p, np.random.default_rng(0))
  out = env.step("[calc(347*862")
  assert out.done and out.info["failure"] == "model"


def test_runner_labels_crashed_episodes_environment_and_classifier_scores():
  verdicts = [failures.Verdict("environment", "crash"), failures.Verdict("task"), failures.Verdict("success")]
  assert [v.trains for v in verdicts] == [False, True, True]
  assert episodes._bucket(3) == 8 and episodes._bucket(9) == 16 and episodes._bucket(16) == 16


def test_environment_failure_rate_alarm():
  from rl_lm import diagnostics

  cfg = diagnostics.AlarmConfig(env_failure_max=0.1)
  assert diagnostics.check_alarms({"episodes/failure_env": 0.05}, cfg) == []
  (alarm,) = diagnostics.check_alarms({"episodes/failure_env": 0.25}, cfg)
  assert alarm.startswith("ALARM episodes/failure_env=0.25 > 0.1")


@pytest.mark.slow
def test_ppo_over_episodes_values_skip_observations(tmp_path):
  """PPO/GAE over an episode's token sequence: advantages and returns live on the sampled tokens only."""
  config = agent_config()
  config.rl.algorithm = "ppo"
  config.rl.kl.placement = "reward"
  trainer = trainer_for(config, tmp_path)
  try:
    rec = record(trainer)
  finally:
    trainer.source.agent.close()
  obs = np.asarray(rec.batch.device.prompt_mask)
  comp = np.asarray(rec.batch.device.completion_mask)
  assert (rec.data["advantages"][obs] == 0).all() and (rec.data["returns"][obs] == 0).all()
  assert np.abs(rec.data["returns"][comp & rec.batch.host.valid[:, None]]).sum() > 0
  assert np.isfinite(rec.metrics["train/loss"])


def test_python_tool_episode_runs_the_program_in_the_sandbox_and_verifies_the_answer():
  from rl_lm.envs.python_tool import INSTRUCTION, PythonToolEnv
  from rl_lm.tasks.base import Problem

  env = PythonToolEnv()
  problem = Problem(id="q", prompt="What is 6 times 7?", answer="42")
  assert env.reset(problem, np.random.default_rng(0)) == f"What is 6 times 7?\n{INSTRUCTION}"
  step = env.step("[python(print(6 * 7))]")
  assert step.observation == "42\n" and not step.done and step.info["tool_calls"] == 1
  step = env.step("[python(print(1/0))]")
  assert "ZeroDivisionError" in step.observation and step.info["tool_error"] and not step.done
  assert env.step("The answer is 42.").reward == 1.0
  env.reset(problem, np.random.default_rng(0))
  assert env.step("The answer is not 42.").reward == 0.0  # a negated answer earns nothing


def test_episodes_compose_with_continuous_batching_and_sampling_ahead(tmp_path):
  """`sampling.slots` > 0 and `rl.max_staleness` 1 with an environment: 32 episodes through 8 cache rows, each step
  trained on episodes sampled by the policy one update old, the loss finite."""
  config = agent_config()
  config.sampling.slots = 8
  config.rl.max_staleness = 1
  config.rl.steps = 2
  trainer = trainer_for(config, tmp_path)
  try:
    assert trainer.source.agent.train.slots == 8
    recs = [record(trainer, step) for step in (1, 2)]
  finally:
    trainer.source.agent.close()
  assert [r.metrics["offpolicy/staleness_mean"] for r in recs] == [0.0, 1.0]
  assert not trainer.source.queue  # nothing sampled past the last step
  for rec in recs:
    assert rec.batch.device.tokens.shape[0] == 32 and np.isfinite(rec.metrics["train/loss"])
    assert rec.metrics["episodes/turns_mean"] >= 1
