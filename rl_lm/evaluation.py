"""pass@k evaluation: the unbiased estimator, an evaluation driver decoupled from the model, and plots.

The estimator is Chen et al. (2021), "Evaluating Large Language Models Trained on Code": with `n`
samples of which `c` are correct, pass@k = 1 - C(n-c, k) / C(n, k), the probability that a random
k-subset of the n samples holds at least one correct one. It is computed as
1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms a large binomial coefficient.

`evaluate(problems, sample_fn, correct_fn, n)` runs an evaluation with any sampler: `sample_fn`
returns n completions per prompt, `correct_fn` judges one completion (True / False, or None when the
verifier itself failed). `write_eval` stores the result as JSON plus a pass@k curve;
`plot_pass_at_k_curves` overlays several evaluations (before / after RL) and `compare` says in words
whether RL sharpened the distribution (pass@1 up) or narrowed it (pass@k at large k down).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rl_lm import plots

SampleFn = Callable[[list[str], int], list[list[str]]]
GreedyFn = Callable[[list[str]], list[str]]
CorrectFn = Callable[[Any, str], "bool | None"]


# ---------------------------------------------------------------------------------------------- estimator


def _check_counts(n: Any, c: Any, k: Any) -> None:
  n, c, k = np.asarray(n), np.asarray(c), np.asarray(k)
  for name, v in (("n", n), ("c", c), ("k", k)):
    if not np.issubdtype(v.dtype, np.integer) and not np.all(np.equal(np.mod(v, 1), 0)):
      raise ValueError(f"pass@k: {name} must be an integer, got {v}")
    if np.any(v < 0):
      raise ValueError(f"pass@k: {name} must be non-negative, got {name}={v}")
  if np.any(k < 1):
    raise ValueError(f"pass@k: k must be >= 1, got k={k}")
  if np.any(c > n):
    raise ValueError(f"pass@k: c (correct samples) cannot exceed n (samples): c={c}, n={n}")
  if np.any(k > n):
    raise ValueError(f"pass@k: k cannot exceed n (samples): k={k}, n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k of one problem with `n` samples, `c` of them correct (Chen et al., 2021).

  Returns 1.0 when n - c < k (every k-subset holds a correct sample), 0.0 when c == 0.
  Raises ValueError when k > n, c > n, k < 1 or any argument is negative.
  """
  _check_counts(n, c, k)
  n, c, k = int(n), int(c), int(k)
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_at_k_array(n: int | np.ndarray, c: np.ndarray, k: int) -> np.ndarray:
  """pass@k for many problems at once: `n` an int or [P], `c` [P] -> [P] float64.

  Same rules as `pass_at_k`, which this agrees with to ~1e-12: the products are evaluated as
  differences of one cumulative sum of log(1 - k/i).
  """
  c = np.asarray(c)
  n = np.broadcast_to(np.asarray(n), c.shape)
  _check_counts(n, c, k)
  n, c, k = n.astype(np.int64), c.astype(np.int64), int(k)
  if c.size == 0:
    return np.zeros(c.shape, np.float64)
  top = int(n.max())
  # cum[m] = sum_{i=k+1}^{m} log(1 - k/i) for m > k, and 0 for m <= k.
  i = np.arange(k + 1, top + 1, dtype=np.float64)
  cum = np.zeros(top + 1, np.float64)
  cum[k + 1:] = np.cumsum(np.log1p(-k / i))
  rest = n - c
  out = 1.0 - np.exp(cum[n] - cum[np.maximum(rest, 0)])
  return np.where(rest < k, 1.0, out)


def pass_at_k_curve(n: int | np.ndarray, correct_counts: np.ndarray, ks: Sequence[int]) -> dict[int, float]:
  """{k: mean over problems of pass@k}.

  `n` is the samples per problem, an int or [P] (per-problem counts of valid samples when some were
  dropped). A problem with fewer than k samples cannot estimate pass@k and is left out of that k's
  mean; a k that no problem can estimate is left out of the result.
  """
  c = np.asarray(correct_counts)
  n = np.broadcast_to(np.asarray(n), c.shape)
  curve = {}
  for k in ks:
    ok = n >= k
    if np.any(ok):
      curve[int(k)] = float(np.mean(pass_at_k_array(n[ok], c[ok], int(k))))
  return curve


def default_ks(n: int) -> list[int]:
  """1, 2, 4, ... up to n, and n itself: default_ks(64) == [1, 2, 4, 8, 16, 32, 64], default_ks(10) ends 8, 10."""
  if n < 1:
    raise ValueError(f"default_ks: n must be >= 1, got {n}")
  ks = [2**i for i in range(int(n).bit_length())]
  return ks if ks[-1] == n else [*ks, n]


# ---------------------------------------------------------------------------------------------- driver


@dataclasses.dataclass
class EvalResult:
  """One evaluation.

  Attributes:
    n: samples requested per problem.
    pass_at_k: {k: mean pass@k over the problems that have >= k valid samples}.
    sample_accuracy: correct / valid over all sampled completions (micro average); pass_at_k[1] is the
      macro average over problems of the same quantity.
    greedy_accuracy: fraction of valid greedy completions that are correct; None without greedy decoding
      (or when every greedy verdict was a verifier error).
    problem_ids: one id per problem (`problem.id` when it has one, else its index).
    correct_counts: per problem, the number of correct samples.
    valid_counts: per problem, the number of samples the verifier could judge (n minus its errors).
    verifier_errors: sampled completions whose verifier failed (excluded from every estimate).
    greedy_verifier_errors: the same for the greedy completions.
    problems_per_k: {k: how many problems entered pass_at_k[k]}.
    examples: a few (prompt, completion, correct) records, for reading what the model writes.
    extra: other scalars measured on the same samples (e.g. the mean gold reward of an RLHF run).
  """

  n: int
  pass_at_k: dict[int, float]
  sample_accuracy: float
  greedy_accuracy: float | None
  problem_ids: list[str]
  correct_counts: list[int]
  valid_counts: list[int]
  verifier_errors: int
  greedy_verifier_errors: int
  problems_per_k: dict[int, int]
  examples: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  extra: dict[str, float] = dataclasses.field(default_factory=dict)

  @property
  def num_problems(self) -> int:
    return len(self.correct_counts)

  def metrics(self, prefix: str = "eval/") -> dict[str, float]:
    """Scalars for a metrics writer: "eval/pass@1", ..., "eval/greedy_accuracy", "eval/verifier_errors"."""
    out = {f"{prefix}pass@{k}": v for k, v in sorted(self.pass_at_k.items())}
    out[f"{prefix}sample_accuracy"] = self.sample_accuracy
    if self.greedy_accuracy is not None:
      out[f"{prefix}greedy_accuracy"] = self.greedy_accuracy
    out[f"{prefix}verifier_errors"] = float(self.verifier_errors)
    out[f"{prefix}greedy_verifier_errors"] = float(self.greedy_verifier_errors)
    out[f"{prefix}num_problems"] = float(self.num_problems)
    out.update({f"{prefix}{k}": float(v) for k, v in self.extra.items()})
    return out

  def line(self) -> str:
    """One line for a log: pass@1, pass@8 and the largest k, greedy accuracy, the tool-call rate (episodes)."""
    ks = sorted(self.pass_at_k)
    parts = [f"pass@{k} {self.pass_at_k[k]:.3f}" for k in ks if k in (1, ks[-1]) or k == 8]
    if self.greedy_accuracy is not None:
      parts.append(f"greedy {self.greedy_accuracy:.3f}")
    if "tool_call_rate" in self.extra:
      parts.append(f"tool calls {self.extra['tool_call_rate']:.3f}")
    return " | ".join(parts)

  def to_dict(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d["pass_at_k"] = {str(k): v for k, v in sorted(self.pass_at_k.items())}
    d["problems_per_k"] = {str(k): v for k, v in sorted(self.problems_per_k.items())}
    d["num_problems"] = self.num_problems
    return d

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2)

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> EvalResult:
    fields = {f.name for f in dataclasses.fields(cls)}
    kw = {k: v for k, v in d.items() if k in fields}
    kw["pass_at_k"] = {int(k): float(v) for k, v in d["pass_at_k"].items()}
    kw["problems_per_k"] = {int(k): int(v) for k, v in d.get("problems_per_k", {}).items()}
    return cls(**kw)

  @classmethod
  def from_json(cls, text: str) -> EvalResult:
    return cls.from_dict(json.loads(text))


def _judge(correct_fn: CorrectFn, problem: Any, completion: str, problem_id: str) -> bool | None:
  """The verdict of `correct_fn`: None (a verifier error, raised or returned) stays None; bools and exact 0/1
  become bools; anything else is a bug."""
  try:
    value = correct_fn(problem, completion)
  except Exception:  # noqa: BLE001 -- a crashing verifier is a verifier error, counted, never a 0
    return None
  if value is None:
    return None
  if isinstance(value, int | float | np.bool_ | np.integer | np.floating) and float(value) in (0.0, 1.0):
    return bool(value)
  raise ValueError(f"evaluate: correct_fn must return True, False or None (verifier error); got {value!r} "
                   f"for problem {problem_id}. Wrap graded scores with a threshold, e.g. correct_from_reward.")


def _batches(fn: Callable[[list[str]], list[Any]], prompts: list[str], size: int, name: str, unit: str
             ) -> Iterator[tuple[int, list[Any]]]:
  """(index of the first prompt, `fn(chunk)`) for each chunk of `size` prompts, lazily; `fn` must return one
  `unit` per prompt."""
  for start in range(0, len(prompts), size):
    chunk = prompts[start:start + size]
    outs = fn(chunk)
    if len(outs) != len(chunk):
      raise ValueError(f"evaluate: {name} returned {len(outs)} {unit} for {len(chunk)} prompts")
    yield start, outs


def correct_from_reward(reward: Callable[[Any, str], Any], threshold: float = 1.0) -> CorrectFn:
  """Adapts a reward returning a `RewardResult`-like object (`.score`, `.valid`) to a `correct_fn`.

  Invalid results (an infrastructure fault: see rewards.registry) become None; otherwise correct means
  score >= threshold.
  """

  def correct_fn(problem: Any, completion: str) -> bool | None:
    result = reward(problem, completion)
    if not getattr(result, "valid", True):
      return None
    return bool(float(result.score) >= threshold)

  return correct_fn


def evaluate(
  problems: Sequence[Any], sample_fn: SampleFn, correct_fn: CorrectFn, n: int, greedy_fn: GreedyFn | None = None,
  ks: Sequence[int] | None = None, batch_size: int | None = None,
) -> EvalResult:
  """Samples `n` completions per problem (and one greedy completion if `greedy_fn`), judges them, estimates pass@k.

  Args:
    problems: objects with a `.prompt` (e.g. `tasks.base.Problem`) or plain prompt strings.
    sample_fn: `sample_fn(prompts, n) -> list[list[str]]`, n completions for each prompt.
    correct_fn: `correct_fn(problem, completion) -> bool | None`. None (or an exception raised by it)
      means the verifier could not decide: the sample is excluded from every estimate and counted in
      `verifier_errors`, and that problem's n becomes its number of valid samples. Any return other
      than True / False / None / exact 0 or 1 raises, so a graded score is never silently truthy.
    n: samples per problem.
    greedy_fn: `greedy_fn(prompts) -> list[str]`, one greedy completion per prompt; optional.
    ks: the k values; default `default_ks(n)`.
    batch_size: prompts per `sample_fn` / `greedy_fn` call (default: all at once).
  """
  if n < 1:
    raise ValueError(f"evaluate: n must be >= 1, got {n}")
  ks = default_ks(n) if ks is None else sorted({int(k) for k in ks})
  if ks and (ks[0] < 1 or ks[-1] > n):
    raise ValueError(f"evaluate: every k must be in [1, n={n}], got {ks}")
  problems = list(problems)
  prompts = [p if isinstance(p, str) else p.prompt for p in problems]
  ids = [str(getattr(p, "id", i)) for i, p in enumerate(problems)]
  step = batch_size or max(len(prompts), 1)

  correct_counts, valid_counts, errors, examples = [], [], 0, []
  for start, samples in _batches(lambda chunk: sample_fn(chunk, n), prompts, step, "sample_fn", "lists"):
    for idx, completions in enumerate(samples, start):
      if len(completions) != n:
        raise ValueError(f"evaluate: sample_fn returned {len(completions)} completions for problem {ids[idx]}, "
                         f"expected n={n}")
      verdicts = [_judge(correct_fn, problems[idx], comp, ids[idx]) for comp in completions]
      judged = [v for v in verdicts if v is not None]
      errors += len(verdicts) - len(judged)
      correct_counts.append(int(sum(judged)))
      valid_counts.append(len(judged))
      if len(examples) < 3:  # a few, for reading what the model writes
        examples.append({"id": ids[idx], "prompt": prompts[idx], "completion": completions[0], "correct": verdicts[0]})

  c, nv = np.asarray(correct_counts, np.int64), np.asarray(valid_counts, np.int64)
  curve = pass_at_k_curve(nv, c, ks)
  problems_per_k = {k: int(np.sum(nv >= k)) for k in ks}
  sample_accuracy = float(c.sum() / nv.sum()) if nv.sum() > 0 else 0.0

  greedy_accuracy, greedy_errors = None, 0
  if greedy_fn is not None:
    verdicts = [_judge(correct_fn, problems[idx], comp, ids[idx])
                for start, outs in _batches(greedy_fn, prompts, step, "greedy_fn", "completions")
                for idx, comp in enumerate(outs, start)]
    judged = [v for v in verdicts if v is not None]
    greedy_errors = len(verdicts) - len(judged)
    greedy_accuracy = sum(judged) / len(judged) if judged else None

  return EvalResult(
    n=int(n), pass_at_k=curve, sample_accuracy=sample_accuracy, greedy_accuracy=greedy_accuracy, problem_ids=ids,
    correct_counts=correct_counts, valid_counts=valid_counts, verifier_errors=errors,
    greedy_verifier_errors=greedy_errors, problems_per_k=problems_per_k, examples=examples,
  )


# ---------------------------------------------------------------------------------------------- output


def plot_pass_at_k_curves(curves: Mapping[str, Mapping[int, float]], path: str | os.PathLike,
                          title: str = "pass@k") -> Path:
  """Overlays pass@k curves ({label: {k: value}}) in one PNG: k on a log2 axis, pass@k on [0, 1]."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(5.5, 4.0), dpi=100)
  all_ks: set[int] = set()
  for label, curve in curves.items():
    ks = sorted(int(k) for k in curve)
    all_ks.update(ks)
    ax.plot(ks, [curve[k] for k in ks], marker="o", label=str(label))
  ax.set_xscale("log", base=2)
  if all_ks:
    ax.set_xticks(sorted(all_ks), labels=[str(k) for k in sorted(all_ks)])
  ax.set_ylim(0.0, 1.02)
  ax.set_xlabel("k (samples)")
  ax.set_ylabel("pass@k")
  ax.set_title(title)
  ax.grid(True, alpha=0.3)
  if curves:
    ax.legend(loc="lower right")
  return plots.save(fig, path)


def write_eval(result: EvalResult, workdir: str | os.PathLike, step: int, label: str = "") -> tuple[Path, Path]:
  """Writes `workdir/eval/step_{step:06d}[_{label}].json` and the matching pass@k curve `.png`; returns both paths.

  In the file name, runs of characters other than letters, digits, "_", "." and "-" in `label` become "_"
  ("before RL" -> step_000000_before_RL.json); the JSON and the plot keep the label as given.
  """
  out_dir = Path(workdir) / "eval"
  out_dir.mkdir(parents=True, exist_ok=True)
  safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_")
  stem = f"step_{step:06d}" + (f"_{safe}" if safe else "")
  json_path, png_path = out_dir / f"{stem}.json", out_dir / f"{stem}.png"
  record = {"step": int(step), "label": label, **result.to_dict()}
  tmp = json_path.with_name(json_path.name + ".tmp")  # written whole or not at all
  tmp.write_text(json.dumps(record, indent=2))
  os.replace(tmp, json_path)
  name = label or f"step {step}"
  plot_pass_at_k_curves({name: result.pass_at_k}, png_path, title=f"pass@k ({name}, n={result.n})")
  return json_path, png_path


def load_eval(path: str | os.PathLike) -> EvalResult:
  """Reads a JSON written by `write_eval`."""
  return EvalResult.from_dict(json.loads(Path(path).read_text()))


def _curve(x: EvalResult | Mapping[int, float]) -> dict[int, float]:
  return dict(x.pass_at_k) if isinstance(x, EvalResult) else {int(k): float(v) for k, v in x.items()}


def compare(before: EvalResult | Mapping[int, float], after: EvalResult | Mapping[int, float],
            tol: float = 0.01) -> str:
  """A one-paragraph summary of how pass@1 and pass@K (the largest k both have) moved, with a verdict.

  Changes within `tol` count as unchanged. Verdicts: "sharpened" (pass@1 up, pass@K flat),
  "sharpened and narrowed" (pass@1 up, pass@K down: mass moved onto fewer solutions, coverage lost),
  "improved" (both up), "narrowed" (pass@K down, pass@1 flat), "regressed" (pass@1 down), "unchanged".
  """
  b, a = _curve(before), _curve(after)
  common = sorted(set(b) & set(a))
  if 1 not in common:
    raise ValueError("compare: both evaluations need pass@1")
  kmax = common[-1]
  d1, dk = a[1] - b[1], a[kmax] - b[kmax]
  up1, down1 = d1 > tol, d1 < -tol
  upk, downk = dk > tol, dk < -tol
  if down1:
    verdict = "regressed: pass@1 fell"
  elif up1 and downk:
    verdict = (f"sharpened and narrowed: pass@1 rose but pass@{kmax} fell, so the policy concentrated on fewer "
               "solutions and lost coverage it had at large k")
  elif up1 and upk:
    verdict = f"improved: both pass@1 and pass@{kmax} rose, so coverage grew as well as precision"
  elif up1:
    verdict = f"sharpened: pass@1 rose while pass@{kmax} held, so RL reweighted solutions the model could already find"
  elif downk:
    verdict = f"narrowed: pass@{kmax} fell while pass@1 held"
  else:
    verdict = f"unchanged: pass@1 and pass@{kmax} moved less than {tol:g}"
  parts = [f"pass@1 {b[1]:.3f} -> {a[1]:.3f} ({d1:+.3f})"]
  if kmax != 1:
    parts.append(f"pass@{kmax} {b[kmax]:.3f} -> {a[kmax]:.3f} ({dk:+.3f})")
  if isinstance(before, EvalResult) and isinstance(after, EvalResult):
    if before.greedy_accuracy is not None and after.greedy_accuracy is not None:
      g = after.greedy_accuracy - before.greedy_accuracy
      parts.append(f"greedy accuracy {before.greedy_accuracy:.3f} -> {after.greedy_accuracy:.3f} ({g:+.3f})")
  return "; ".join(parts) + f". Verdict: {verdict}."


__all__ = [
  "EvalResult", "compare", "correct_from_reward", "default_ks", "evaluate", "load_eval", "pass_at_k",
  "pass_at_k_array", "pass_at_k_curve", "plot_pass_at_k_curves", "write_eval",
]
