"""The sections of the data and of the supervised stages: task, reward, preferences, sft, reward_model, dpo."""

from __future__ import annotations

import dataclasses
import os

from rl_lm.config.section import Section, folder, knob, registered


@dataclasses.dataclass(frozen=True)
class Task(Section):
  """Where prompts come from (rl_lm.tasks)."""

  KEY, STAGES = "task", ("sft", "reward_model", "dpo", "rl")
  name: str = knob("arithmetic", registered("rl_lm.tasks", "TASKS"))  # arithmetic | products | gsm8k | humaneval
  #                                                                    | preferences | a task registered by then
  levels: tuple[int, ...] = (1, 2, 3)  # arithmetic difficulty levels in play
  worked: bool = False  # arithmetic: SFT targets show one operation per line before the answer
  test_fraction: float = knob(0.1, "(0, 1)")  # arithmetic: share of expressions (by hash) held out for evaluation
  decimal_demos: float = knob(0.0, "[0, 1]")  # arithmetic: share of SFT targets written "33.0" (imperfect demos)
  digits: int = knob(3, "(0, inf)")  # products: digits of each factor
  tool_demos: float = knob(0.5, "[0, 1]")  # products: share of SFT demonstrations that call the calculator
  data_dir: str = knob("", folder)  # gsm8k / humaneval: folder of the JSONL files ("" = data/<task> in the repository)
  template: str = "plain"  # plain | chat (the checkpoint's chat template frames the prompt as a user turn; any
  #                          task but preferences, needs an hf tokenizer) | gsm8k only: a string with {question}
  pool_size: int = knob(4000, "(0, inf)")  # training prompts the curriculum draws from (procedural tasks)
  eval_size: int = knob(200, "(0, inf)")  # held-out problems per evaluation

  def check(self) -> None:
    from rl_lm.tasks.arithmetic import LEVELS

    bad = [lv for lv in self.levels if lv not in LEVELS]
    self.require(self.name != "arithmetic" or (bool(self.levels) and not bad), "levels",
                 f"unknown arithmetic levels {bad or list(self.levels)}; known: {sorted(LEVELS)}")
    custom = self.name == "gsm8k" and "{question}" in self.template
    self.require(self.template in ("plain", "chat") or custom, "template", "must be 'plain' or 'chat' (or, for gsm8k, "
                 f"a string containing '{{question}}'), got {self.template!r}")
    self.require(not (self.name == "preferences" and self.template == "chat"), "template",
                 "the preferences task has no chat form")


@dataclasses.dataclass(frozen=True)
class Reward(Section):
  """What RL is rewarded with."""

  KEY, STAGES = "reward", ("rl",)
  weights: dict[str, float] = dataclasses.field(default_factory=lambda: {"correctness": 1.0})  # {reward name: weight}
  learned: bool = False  # RL trains on the reward model (reward_model stage or model_checkpoint); the rewards
  #                        in `weights` are then measured beside it as the gold reward, never trained on
  model_checkpoint: str = ""  # a reward_model checkpoint folder; "": the reward_model stage of this run
  gold: dict[str, float] = dataclasses.field(default_factory=dict)  # rewards measured beside `weights`, never
  #                        trained on (rollout/gold_mean): the gold behind an LLM judge's reward
  success_threshold: float = 1.0  # an episode with score >= this counts as solved (pass rate, curriculum)

  def check(self) -> None:
    unknown = registered("rl_lm.rewards", "REWARDS")
    self.require(len(self.weights) > 0, "weights", "must name at least one reward")
    for name, weight in self.weights.items():
      problem = unknown(name)
      self.require(problem is None, f"weights.{name}", problem)
      self.require(isinstance(weight, (int, float)), f"weights.{name}", f"weight must be a number, got {weight!r}")
    for name, weight in self.gold.items():
      problem = unknown(name)
      self.require(problem is None, f"gold.{name}", problem)
      self.require(isinstance(weight, (int, float)), f"gold.{name}", f"weight must be a number, got {weight!r}")
    self.require(not (self.gold and self.learned), "gold", "with learned = True the rewards in `weights` are "
                 "already the gold, measured beside the reward model")
    missing = folder(self.model_checkpoint)
    self.require(not self.learned or missing is None, "model_checkpoint", missing)


@dataclasses.dataclass(frozen=True)
class Sft(Section):
  """The "sft" stage: next-token loss on reference completions."""

  KEY, STAGES = "sft", ("sft", "teacher_sft", "cai_sft")
  steps: int = knob(300, "(0, inf)")
  batch_size: int = knob(64, "(0, inf)")
  max_len: int = knob(48, "(0, inf)")  # bos + prompt + target + eos, right-padded
  learning_rate: float = knob(3e-3, "(0, inf)")
  warmup_steps: int = knob(30, "[0, inf)")
  weight_decay: float = knob(0.0, "[0, inf)")
  log_every: int = knob(50, "(0, inf)")
  init_from: str = knob("", folder)  # a checkpoint folder (<run>/checkpoints/<stage>, or one step in it) to start from


@dataclasses.dataclass(frozen=True)
class Cai(Section):
  """The "cai_sft" stage (rl_lm/train/constitution.py): answer, critique against a principle, revise; SFT on the
  revisions with `config.sft`; compliance measured before and after by the principles' checks."""

  KEY, STAGES = "cai", ("cai_sft",)
  constitution: str = ""  # a JSON file of principles; "": the built-in rl_lm/train/constitution.json
  prompts: int = knob(50, "(0, inf)")  # training prompts answered, critiqued and revised (one transcript each)
  eval_prompts: int = knob(100, "(0, inf)")  # held-out prompts whose answers' compliance is measured
  max_prompt_len: int = knob(256, "(0, inf)")  # tokens of a critique or revision prompt (longer: no transcript)
  max_new_tokens: int = knob(48, "(0, inf)")  # tokens of a critique or a revision

  def check(self) -> None:
    self.require(not self.constitution or os.path.isfile(self.constitution), "constitution",
                 f"no such file {self.constitution!r}")


@dataclasses.dataclass(frozen=True)
class Preferences(Section):
  """Pairs for the "reward_model" and "dpo" stages."""

  KEY, STAGES = "preferences", ("reward_model", "dpo")
  source: str = "synthetic"  # synthetic (task.name="preferences") | a JSONL file of pairs
  train_pairs: int = knob(4000, "(0, inf)")  # synthetic: pairs drawn on training prompts
  eval_pairs: int = knob(500, "(0, inf)")  # held-out pairs (synthetic: held-out prompts; JSONL: the file's last lines)
  label_noise: float = knob(0.0, "[0, 0.5]")  # synthetic: probability that a Bradley-Terry label is flipped
  labeller: str = knob("given", ("given", "judge"))  # the training pairs' labels: the source's, or the pairwise
  #                                                   LLM judge's (RLAIF; config.judge), held-out pairs unchanged
  beta: float = knob(100.0, "(0, inf)")  # synthetic: Bradley-Terry temperature of the labeller on the gold score
  max_len: int = knob(24, "(0, inf)")  # bos + prompt + completion + eos, right-padded

  def check(self) -> None:
    self.require(self.source == "synthetic" or os.path.isfile(self.source), "source",
                 f"no such JSONL file {self.source!r}")


@dataclasses.dataclass(frozen=True)
class RewardModel(Section):
  """The "reward_model" stage: Bradley-Terry on a scalar head."""

  KEY, STAGES = "reward_model", ("reward_model",)
  steps: int = knob(300, "(0, inf)")
  batch_size: int = knob(32, "(0, inf)")  # pairs per step
  learning_rate: float = knob(3e-4, "(0, inf)")
  warmup_steps: int = knob(20, "[0, inf)")
  weight_decay: float = knob(0.0, "[0, inf)")
  log_every: int = knob(50, "(0, inf)")
  init_from: str = knob("", folder)  # backbone from a checkpoint folder; "": the policy the stage before left
  normalize_samples: int = knob(256, "[0, inf)")  # policy samples whose mean reward is subtracted (zero mean); 0: off


@dataclasses.dataclass(frozen=True)
class Dpo(Section):
  """The "dpo" stage: DPO / IPO against the frozen starting policy."""

  KEY, STAGES = "dpo", ("dpo",)
  loss_type: str = knob("dpo", ("dpo", "ipo"))
  beta: float = knob(0.1, "(0, inf)")  # KL strength (IPO: the tau of Azar et al.)
  label_smoothing: float = knob(0.0, "[0, 0.5)")  # conservative DPO (dpo loss only): assumed label-flip rate
  nll_coef: float = knob(0.0, "[0, inf)")  # RPO: + coef x per-token NLL of the chosen responses (holds them up)
  steps: int = knob(300, "(0, inf)")
  batch_size: int = knob(32, "(0, inf)")  # pairs per step
  learning_rate: float = knob(1e-4, "(0, inf)")
  warmup_steps: int = knob(20, "[0, inf)")
  weight_decay: float = knob(0.0, "[0, inf)")
  log_every: int = knob(50, "(0, inf)")
  init_from: str = knob("", folder)  # a checkpoint folder to start from; "": the policy the stage before left
  eval_prompts: int = 200  # held-out prompts sampled before and after DPO for the gold win rate

  def check(self) -> None:
    self.require(self.loss_type == "dpo" or self.label_smoothing == 0, "label_smoothing",
                 "applies to the dpo loss only")
