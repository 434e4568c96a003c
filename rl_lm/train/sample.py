"""The "sample" stage: draw completions from the policy for fixed prompts and report throughput.

It exercises the path every run takes (config -> mesh -> sharded parameters -> jitted KV-cache
sampler -> decode) and writes `samples.jsonl` in the workdir; after an "sft" or "rl" stage it
shows what the trained policy writes.
"""

from __future__ import annotations

import itertools
import json
import os
import time

import jax

from rl_lm import mesh as mesh_lib
from rl_lm import sampling
from rl_lm.train.context import Context


def run(ctx: Context) -> None:
  config, workdir, mesh, rules, key = ctx.config, ctx.workdir, ctx.mesh, ctx.rules, ctx.key
  model_cfg, params, tok = ctx.model_cfg, ctx.policy, ctx.tokenizer
  source = "random init" if not config.model.hf_checkpoint else config.model.hf_checkpoint
  print(f"rl_lm: model {config.model.preset if not config.model.hf_checkpoint else 'hf'} "
        f"({model_cfg.num_params() / 1e6:.2f}M params, {source}) on mesh {dict(mesh.shape)}", flush=True)

  texts = list(itertools.islice(itertools.cycle(config.sample.prompts), config.sample.batch_size))
  prompts, lengths = sampling.pad_prompts([tok.encode_prompt(t) for t in texts], tok.pad_id, multiple=8)
  batch_sharding = mesh_lib.batch_sharding(mesh, rules, prompts.shape)
  prompts = mesh_lib.put(prompts, batch_sharding)
  lengths = mesh_lib.put(lengths, mesh_lib.batch_sharding(mesh, rules, lengths.shape))
  scfg = sampling.config_from(config.sampling, tok)
  generate = sampling.make_generate_fn(model_cfg, scfg, mesh, rules)

  records, timings = [], []
  for b in range(config.sample.num_batches):
    start = time.perf_counter()
    out = jax.block_until_ready(generate(params, prompts, lengths, jax.random.fold_in(key, b + 1)))
    seconds = time.perf_counter() - start
    out = mesh_lib.fetch(out)  # whole on every process
    n_tokens = int(out.lengths.sum())
    timings.append((seconds, n_tokens))
    tag = " (includes compilation)" if b == 0 else ""
    print(f"rl_lm: batch {b + 1}/{config.sample.num_batches}: {n_tokens} tokens in {seconds:.2f}s{tag}", flush=True)
    tokens = out.tokens
    P = prompts.shape[1]
    for i, text in enumerate(texts):
      completion = tok.decode(tokens[i, P: P + int(out.lengths[i])])
      records.append({"batch": b, "prompt": text, "completion": completion, "length": int(out.lengths[i]),
                      "finished": bool(out.finished[i]),
                      "sum_logprob": float(out.logprobs[i].sum())})

  for r in records[: min(4, len(records))]:
    print(f"  {r['prompt']!r} -> {r['completion']!r}", flush=True)
  steady = timings[1:] or timings
  tps = sum(n for _, n in steady) / max(sum(s for s, _ in steady), 1e-9)
  print(f"rl_lm: decode throughput {tps:.0f} tokens/s over {len(steady)} batch(es) after compilation", flush=True)
  path = os.path.join(workdir, "samples.jsonl")
  if jax.process_index() != 0:  # every process holds the same records; one writes them
    return
  with open(path, "w") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")
  print(f"rl_lm: wrote {len(records)} samples to {path}", flush=True)
