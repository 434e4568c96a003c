"""Sampling from the policy: one decode engine and its drivers, and the rollout batch the RL step trains on.

- types.py     `SamplingConfig` (how tokens are drawn) and `Rollout` (what a sampler returns, its layout)
- draw.py      one token per row from logits: top-k / top-p by bisection, inverse-CDF draws, their log-probs
- engine.py    the decode step on a named state and the one `lax.while_loop` that decodes tokens
- generate.py  the static batch and continuous batching over single-turn prompts
- turns.py     the policy's turns of multi-turn episodes (continuous batching over episodes too)
- batch.py     `RolloutBatch`: a rollout's device and host halves, from the sampler to `prepare`

The public entry points are `rl_lm.sampling.generate` and `make_generate_fn`; the episodes' host side (the
environments) is `rl_lm.envs.episodes`.
"""
