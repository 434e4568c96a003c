"""Verifier throughput: maths (GSM8K), code (HumanEval, 1 and 2 workers), and the sandbox's fixed cost.

    python -m experiments.benchmarks.verifiers [--json=out.json] [--fixed_cost_runs=40] [--parts=fixed_cost]

Prints a markdown table. The fixed cost is the mean wall time of one trivial program through the
sandbox minus that of a bare `python -c pass`, both measured here, sequentially, in the same run; it
is measured for the jail (bubblewrap, when it runs here) and for the fallback without it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rl_lm.rewards.audit import PROBE_TESTS, change_final_number  # noqa: E402
from rl_lm.rewards.code import CodeJob, Sandbox, SandboxLimits, SandboxPolicy, job_for  # noqa: E402
from rl_lm.rewards.maths import MathsReward, SymbolicPool, verify_answer  # noqa: E402
from rl_lm.tasks.arithmetic import ArithmeticTask, is_correct  # noqa: E402
from rl_lm.tasks.gsm8k import GSM8KTask  # noqa: E402
from rl_lm.tasks.humaneval import HumanEvalTask  # noqa: E402


def _rate(n: int, seconds: float) -> float:
  return n / seconds if seconds > 0 else float("inf")


def bench_maths() -> dict:
  problems = GSM8KTask().test_problems()
  completions = [p.reference for p in problems] + [change_final_number(p.reference, p.answer) for p in problems]
  doubled = problems + problems
  reward = MathsReward()
  start = time.perf_counter()
  results = reward.batch(doubled, completions)
  seconds = time.perf_counter() - start
  assert sum(r.score for r in results) == len(problems)
  pool = SymbolicPool(workers=1, timeout_s=10.0)
  verify_answer("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", pool=pool)  # start the worker outside the clock
  symbolic = [(f"{i}\\sqrt{{2}}", f"\\boxed{{\\sqrt{{{2 * i * i}}}}}") for i in range(1, 101)]
  start = time.perf_counter()
  ok = sum(verify_answer(g, c, pool=pool).score for g, c in symbolic)
  sym_seconds = time.perf_counter() - start
  pool.close()
  assert ok == len(symbolic)
  return {
    "gsm8k_verifications": len(completions), "gsm8k_per_s": _rate(len(completions), seconds),
    "symbolic_verifications": len(symbolic), "symbolic_per_s": _rate(len(symbolic), sym_seconds),
  }


def bench_arithmetic() -> dict:
  problems = ArithmeticTask().test_problems(2000)
  start = time.perf_counter()
  ok = sum(is_correct(p, p.answer) for p in problems)
  seconds = time.perf_counter() - start
  assert ok == len(problems)
  return {"arithmetic_verifications": len(problems), "arithmetic_per_s": _rate(len(problems), seconds)}


def bench_code() -> dict:
  problems = HumanEvalTask().test_problems()
  jobs = [job_for(p, p.reference) for p in problems]
  out = {}
  for workers in (1, 2):
    sandbox = Sandbox(SandboxLimits(timeout_s=20.0), workers=workers)
    start = time.perf_counter()
    results = sandbox.run_many(jobs)
    seconds = time.perf_counter() - start
    out[f"humaneval_passed_{workers}w"] = sum(r.passed for r in results)
    out[f"humaneval_per_s_{workers}w"] = _rate(len(jobs), seconds)
    out[f"humaneval_seconds_{workers}w"] = seconds
  out["layers"] = list(results[0].layers)
  return out


def _mean_run_s(sandbox: Sandbox, runs: int) -> float:
  job = CodeJob("def add(a, b):\n  return a + b\n", PROBE_TESTS, "add")
  sandbox.run(job)  # warm the page cache
  start = time.perf_counter()
  for _ in range(runs):
    assert sandbox.run(job).passed
  return (time.perf_counter() - start) / runs


def bench_fixed_cost(runs: int) -> dict:
  jail = Sandbox(SandboxLimits(timeout_s=10.0))
  sandboxed = _mean_run_s(jail, runs)
  fallback = _mean_run_s(Sandbox(SandboxLimits(timeout_s=10.0), SandboxPolicy(jail=False)), runs)
  bare = {}
  commands = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -I -S -c pass": [sys.executable, "-I", "-S", "-c", "pass"],
  }
  for name, argv in commands.items():
    subprocess.run(argv, check=True)
    start = time.perf_counter()
    for _ in range(runs):
      subprocess.run(argv, check=True)
    bare[name] = (time.perf_counter() - start) / runs
  return {
    "sandbox_ms": 1000 * sandboxed, "sandbox_jailed": jail.jailed, "fallback_ms": 1000 * fallback,
    "bare_python_ms": 1000 * bare["python -c pass"], "bare_isolated_python_ms": 1000 * bare["python -I -S -c pass"],
    "fixed_cost_ms": 1000 * (sandboxed - bare["python -c pass"]),
    "fallback_fixed_cost_ms": 1000 * (fallback - bare["python -c pass"]), "runs": runs,
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--json", default=None)
  parser.add_argument("--fixed_cost_runs", type=int, default=40)
  parser.add_argument("--parts", default="arithmetic,maths,code,fixed_cost", help="comma-separated subset")
  args = parser.parse_args()
  parts = set(args.parts.split(","))
  res = {"machine": f"{platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}"}
  rows = []
  if "arithmetic" in parts:
    res.update(bench_arithmetic())
    rows.append(("arithmetic exact check", f"{res['arithmetic_per_s']:,.0f} /s",
                 f"{res['arithmetic_verifications']:,} test problems, levels 1-5"))
  if "maths" in parts:
    res.update(bench_maths())
    rows.append(("maths, GSM8K (exact path)", f"{res['gsm8k_per_s']:,.0f} /s",
                 f"{res['gsm8k_verifications']} = 1,319 refs + 1,319 changed"))
    rows.append(("maths, symbolic (math-verify, 1 worker)", f"{res['symbolic_per_s']:,.0f} /s",
                 "100 roots, e.g. `\\sqrt{8}` vs `2\\sqrt{2}`"))
  if "code" in parts:
    res.update(bench_code())
    for w in (1, 2):
      rows.append((f"code, HumanEval, {w} worker{'s' * (w > 1)}", f"{res[f'humaneval_per_s_{w}w']:.1f} /s",
                   f"{res[f'humaneval_passed_{w}w']}/164 passed, {res[f'humaneval_seconds_{w}w']:.1f}s"))
  if "fixed_cost" in parts:
    res.update(bench_fixed_cost(args.fixed_cost_runs))
    mode = "jail (bubblewrap)" if res["sandbox_jailed"] else "fallback: bubblewrap cannot run here"
    rows += [
      ("sandbox, trivial program", f"{res['sandbox_ms']:.1f} ms", f"mean of {res['runs']}, sequential; {mode}"),
      ("sandbox without the jail (fallback)", f"{res['fallback_ms']:.1f} ms", f"mean of {res['runs']}"),
      ("bare `python -c pass`", f"{res['bare_python_ms']:.1f} ms",
       f"`-I -S`: {res['bare_isolated_python_ms']:.1f} ms"),
      ("sandbox fixed cost", f"{res['fixed_cost_ms']:.1f} ms",
       f"sandbox minus bare python (fallback: {res['fallback_fixed_cost_ms']:.1f} ms)"),
    ]
  layers = f"; sandbox layers: {', '.join(res['layers'])}" if "layers" in res else ""
  print(f"machine: {res['machine']}{layers}\n")
  print("| measure | value | notes |\n| --- | --- | --- |")
  for row in rows:
    print("| " + " | ".join(row) + " |")
  if args.json:
    Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
  main()
