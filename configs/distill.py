"""On-policy distillation on the default's task: the SFT-only student samples, a frozen teacher scores every token.

  python -m rl_lm.main --config=configs/default.py --workdir=/tmp/rl_lm/teacher                   # the teacher
  python -m rl_lm.main --config=configs/distill.py --workdir=/tmp/rl_lm/distill \\
      --config.teacher.init_from=/tmp/rl_lm/teacher/checkpoints/rl

The teacher is the tiny model after the default's SFT + GRPO (`<its run>/checkpoints/rl`: a full-weight
checkpoint, so not a LoRA run); the student is this run's own SFT stage, the same SFT the teacher started from.
The RL stage then trains on the per-token reward log pi_teacher - log pi_student of the student's own samples
(rl_lm/rl/distill.py), with no verifier reward and no KL to the SFT reference: the teacher is the leash.

Variants (`--config=configs/distill.py:<variant>`):
  mixed            the distillation reward beside the verifier's GRPO advantage (weights 1 and 1)
  gkd              the GKD form (Agarwal et al. 2024): the generalised JSD (beta 0.5) between the two models'
                   whole next-token distributions as a loss term, on the student's samples in half the steps
                   (lambda 0.5) and on the teacher's in the others
  offpolicy        off-policy distillation, the baseline: after SFT, a second SFT ("teacher_sft") on the teacher's
                   samples of the training pool (`teacher.samples_per_problem` each), held-out pass@k before and
                   after it (rl_lm/train/offpolicy.py); `sft.steps` sets its length
  smoke, mixed_smoke, gkd_smoke, offpolicy_smoke
                   seconds, for tests (the teacher still comes from --config.teacher.init_from)
The RL baseline is configs/default.py itself (GRPO on the verifier reward, the same SFT).
"""

from __future__ import annotations

import ml_collections

from configs import default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = (None, "mixed", "gkd", "offpolicy", "smoke", "mixed_smoke", "gkd_smoke", "offpolicy_smoke")
  if arg not in variants:
    raise ValueError(f"configs/distill.py: unknown variant {arg!r}; known: {', '.join(map(str, variants[1:]))}")
  config = default.get_config("smoke" if arg and arg.endswith("smoke") else None)
  arg = (arg or "").removesuffix("smoke").removesuffix("_") or None
  config.rl.distill.coef = 1.0
  config.rl.distill.verifier = 1.0 if arg == "mixed" else 0.0
  if arg == "gkd":
    config.rl.distill.loss, config.rl.distill.beta, config.rl.distill.on_policy = "jsd", 0.5, 0.5
  if arg and arg.startswith("offpolicy"):  # SFT on the teacher's samples instead of RL: no rl stage
    config.stages = ("sft", "teacher_sft")
    config.rl.distill.coef = 0.0
  config.rl.kl.placement = "none"  # the teacher, not the SFT reference, is what the student is pulled towards
  config.teacher.param_dtype = "float32"  # the tiny teacher is 2 MB: bfloat16 would change its log-probs for nothing
  return config
