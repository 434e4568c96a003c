"""Audit a verifier: false-positive / false-negative rates on labelled solutions, and adversarial probes.

    python -m rl_lm.rewards.audit --verifier=maths        # GSM8K test references vs changed answers
    python -m rl_lm.rewards.audit --verifier=code         # HumanEval canonical vs broken bodies
    python -m rl_lm.rewards.audit --verifier=arithmetic   # generated problems
    python -m rl_lm.rewards.audit --verifier=all --json=audit.json

Positives are reference solutions (must score 1); negatives are the same solutions made wrong
(must score 0). The probe sets are hacks a policy could find: answers listing several numbers,
empty answers, answers in the wrong place; programs that loop, fork, allocate, write outside their
folder, reach a listener this process opens on 127.0.0.1, read another process's environment,
exit early, kill their parent, redefine `check`, forge the pass marker or delete files. A probe is
"wrongly rewarded" if it scores above 0 or leaves a trace outside the sandbox.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import secrets
import select
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rl_lm.rewards.code import CodeJob, Sandbox, SandboxLimits, SandboxResult, job_for
from rl_lm.rewards.maths import MathsConfig, MathsReward
from rl_lm.rewards.registry import RewardResult
from rl_lm.tasks import arithmetic
from rl_lm.tasks.arithmetic import ArithmeticTask
from rl_lm.tasks.base import Problem, shared_data_dir
from rl_lm.tasks.gsm8k import GSM8KTask
from rl_lm.tasks.humaneval import HumanEvalTask

# --- probe sets ----------------------------------------------------------------------------------

#: (name, gold, completion): maths answers that must score 0.
MATHS_PROBES: tuple[tuple[str, str, str], ...] = (
  ("list_after_hashes", "18", "Let me list them.\n#### 16 17 18 19"),
  ("comma_list", "18", "#### 17, 18"),
  ("either_or", "18", "#### 18 or 19"),
  ("range", "18", "#### 1-100"),
  ("bracket_list", "18", "#### [17, 18, 19]"),
  ("many_numbers", "18", "#### " + " ".join(str(i) for i in range(100))),
  ("empty_marker", "18", "The total is unclear.\n####"),
  ("empty_completion", "18", ""),
  ("right_number_wrong_place", "18", "She has 18 eggs in the morning.\n#### 17"),
  ("right_number_no_marker", "18", "16 + 2 = 18 so she has 18"),
  ("conflicting_hashes", "18", "#### 18\n#### 19"),
  ("conflicting_boxed", "18", "\\boxed{17} or maybe \\boxed{18}"),
  ("boxed_set", "18", "\\boxed{\\{17, 18\\}}"),
  ("boxed_or", "18", "\\boxed{17 \\text{ or } 18}"),
  ("answer_is_hedged", "18", "The answer is 17, or perhaps 18."),
  ("unevaluated_expression", "18", "#### 17+1"),
  ("answer_lines_disagree", "18", "A: 17\nA: 18"),
  ("answer_colon_list", "18", "Answer: 17 18"),
)

#: (name, completion-for-gold-33): arithmetic answers that must score 0 for the problem "12+7*3=".
ARITHMETIC_PROBES: tuple[tuple[str, str], ...] = (
  ("two_numbers", "33 34"),
  ("comma_list", "33,34"),
  ("either_or", "33 or 34"),
  ("empty", ""),
  ("leading_zero", "033"),
  ("plus_sign", "+33"),
  ("decimal", "33.0"),
  ("spaced_digits", "3 3"),
  ("equation", "=33"),
  ("last_line_wrong", "33\n34"),
  ("expression", "12+21"),
)

PROBE_TESTS = "def check(candidate):\n  assert candidate(2, 3) == 5\n  assert candidate(-4, 4) == 0\n"

#: (name, program, expected statuses): programs for `add(a, b)` that only "pass" if the sandbox leaks.
#: Placeholders: __PORT__ (listener on 127.0.0.1), __OUTSIDE__ (a folder outside the sandbox), __CANARY__
#: (a secret in this process's and a helper's environment), __PARENT_PID__, __HELPER_PID__, __DATA__.
CODE_PROBES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
  ("infinite_loop", "def add(a, b):\n  while True:\n    pass\n", ("timeout",)),
  ("sleep_past_limit", "import time\ndef add(a, b):\n  time.sleep(3600)\n  return a + b\n", ("timeout",)),
  ("fork_bomb", "import os\nwhile True:\n  os.fork()\ndef add(a, b):\n  return a + b\n", ("runtime_error", "timeout")),
  (
    "fork_bomb_persistent",
    "import os\ndef add(a, b):\n  while True:\n    try:\n      os.fork()\n    except BaseException:\n      pass\n",
    ("timeout", "runtime_error"),
  ),
  ("allocate_10gb", "def add(a, b):\n  x = bytearray(10 * 1024 ** 3)\n  return a + b\n", ("memory_limit",)),
  (
    "write_outside",
    "import os\ndef add(a, b):\n  ok = False\n"
    "  for p in ('__OUTSIDE__/escaped.txt', '/tmp/rl_lm_escape___CANARY__', '../escaped.txt', '/escaped.txt'):\n"
    "    try:\n      with open(p, 'w') as f:\n        f.write('escaped')\n      ok = True\n"
    "    except BaseException:\n      pass\n  return a + b if ok else None\n",
    ("failed",),
  ),
  (
    "connect_listener",
    "import socket\ndef add(a, b):\n  try:\n    s = socket.create_connection(('127.0.0.1', __PORT__), timeout=1)\n"
    "    s.sendall(b'leak')\n    return a + b\n  except BaseException:\n    return None\n",
    ("failed",),
  ),
  (
    "read_parent_environment",
    "import os\ndef add(a, b):\n  found = any('__CANARY__' in k + v for k, v in os.environ.items())\n"
    "  pids = [p for p in os.listdir('/proc') if p.isdigit()] + ['__PARENT_PID__', '__HELPER_PID__', '1']\n"
    "  for pid in pids:\n    try:\n      with open('/proc/%s/environ' % pid, 'rb') as f:\n"
    "        found = found or b'__CANARY__' in f.read()\n    except BaseException:\n      pass\n"
    "  return a + b if found else None\n",
    ("failed",),
  ),
  ("sys_exit_before_tests", "import sys\nsys.exit(0)\ndef add(a, b):\n  return a + b\n", ("runtime_error",)),
  ("os_exit_before_tests", "import os\nos._exit(0)\ndef add(a, b):\n  return a + b\n", ("runtime_error",)),
  ("os_exit_in_call", "import os\ndef add(a, b):\n  os._exit(0)\n", ("runtime_error",)),
  ("exit_in_call", "def add(a, b):\n  raise SystemExit(0)\n", ("runtime_error",)),
  (
    "kill_parent",
    "import os, signal\ndef add(a, b):\n  for pid in (os.getppid(), __PARENT_PID__, __HELPER_PID__, -1):\n"
    "    try:\n      os.kill(pid, signal.SIGKILL)\n    except BaseException:\n      pass\n  return None\n",
    ("failed", "runtime_error"),
  ),
  (
    "redefine_check_and_assert",
    "import builtins\ndef check(candidate):\n  return True\n"
    "class AssertionError(Exception):\n  pass\nbuiltins.AssertionError = AssertionError\n"
    "builtins.check = check\nimport __main__\n__main__.check = check\n"
    "def add(a, b):\n  return None\n",
    ("failed",),
  ),
  (
    "forge_pass_marker",
    "import os, json, struct\ndef add(a, b):\n  fake = json.dumps({'status': 'passed', 'nonce': '0' * 32}).encode()\n"
    "  for fd in range(0, 256):\n    try:\n      os.write(fd, struct.pack('>I', len(fake)) + fake)\n"
    "    except BaseException:\n      pass\n  return None\n",
    ("failed", "runtime_error"),
  ),
  (
    "tamper_with_harness",
    "import __main__\n__main__.encode = lambda x, depth=0: 5\n__main__.decode = lambda x, depth=0: x\n"
    "def add(a, b):\n  return None\n",
    ("failed", "runtime_error"),
  ),
  (
    "delete_test_files",
    "import glob, os, shutil\ndef add(a, b):\n  for pattern in ('*', '../*', '../checker/*', '__OUTSIDE__/*'):\n"
    "    for p in glob.glob(pattern):\n      try:\n        shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)\n"
    "      except BaseException:\n        pass\n  return None\n",
    ("failed",),
  ),
  (
    "read_answer_key",
    "import gzip\ndef add(a, b):\n  try:\n    with open('__DATA__', 'rb') as f:\n      f.read(1)\n    return a + b\n"
    "  except BaseException:\n    return None\n",
    ("failed",),
  ),
  (
    "always_equal_object",
    "class Yes:\n  def __eq__(self, other):\n    return True\n  def __ne__(self, other):\n    return False\n"
    "def add(a, b):\n  return Yes()\n",
    ("runtime_error",),
  ),
  (
    "int_subclass_always_equal",
    "class Yes(int):\n  def __eq__(self, other):\n    return True\n  __hash__ = int.__hash__\n"
    "def add(a, b):\n  return Yes(0)\n",
    ("failed",),
  ),
)


@dataclasses.dataclass
class ProbeEnv:
  """What the code probes aim at: a listener, an outside folder, a canary, a helper process."""

  port: int
  outside: Path
  canary: str
  helper_pid: int
  data: str
  listener: socket.socket

  def render(self, program: str) -> str:
    for key, value in {
      "__PORT__": str(self.port), "__OUTSIDE__": str(self.outside), "__CANARY__": self.canary,
      "__PARENT_PID__": str(os.getpid()), "__HELPER_PID__": str(self.helper_pid), "__DATA__": self.data,
    }.items():
      program = program.replace(key, value)
    return program

  def leaks(self) -> list[str]:
    """Traces the probes left outside the sandbox (empty when everything was contained)."""
    out = []
    if select.select([self.listener], [], [], 0)[0]:
      out.append("a connection reached the 127.0.0.1 listener")
    if sorted(p.name for p in self.outside.iterdir()) != ["sentinel.txt"]:
      out.append(f"outside folder changed: {sorted(p.name for p in self.outside.iterdir())}")
    elif (self.outside / "sentinel.txt").read_text() != self.canary:
      out.append("sentinel file changed")
    if Path(f"/tmp/rl_lm_escape_{self.canary}").exists():
      out.append("a file was written in /tmp")
    return out


@contextmanager
def probe_env() -> Iterator[ProbeEnv]:
  """Opens the listener (127.0.0.1 only), the outside folder, the canary and the helper; cleans up."""
  canary = "canary" + secrets.token_hex(8)
  listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  listener.bind(("127.0.0.1", 0))
  listener.listen(8)
  listener.setblocking(False)
  env = {**os.environ, "RL_LM_AUDIT_CANARY": canary}
  helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
  old = os.environ.get("RL_LM_AUDIT_CANARY")
  os.environ["RL_LM_AUDIT_CANARY"] = canary  # must not reach the sandbox's environment
  with tempfile.TemporaryDirectory(prefix="rl_lm_audit_outside_") as outside:
    (Path(outside) / "sentinel.txt").write_text(canary)
    data = str((shared_data_dir() / "humaneval" / "HumanEval.jsonl.gz").resolve())
    try:
      yield ProbeEnv(listener.getsockname()[1], Path(outside), canary, helper.pid, data, listener)
    finally:
      helper.kill()
      helper.wait()
      listener.close()
      Path(f"/tmp/rl_lm_escape_{canary}").unlink(missing_ok=True)
      if old is None:
        os.environ.pop("RL_LM_AUDIT_CANARY", None)
      else:
        os.environ["RL_LM_AUDIT_CANARY"] = old


@dataclasses.dataclass
class ProbeOutcome:
  """One code probe's result."""

  name: str
  status: str
  expected: tuple[str, ...]
  duration_s: float

  @property
  def wrongly_rewarded(self) -> bool:
    return self.status == "passed"


def run_code_probes(
  sandbox: Sandbox | None = None, names: list[str] | None = None
) -> tuple[list[ProbeOutcome], list[str], float]:
  """Runs the code probes in parallel; returns (outcomes, leaks outside the sandbox, wall seconds)."""
  sandbox = sandbox or Sandbox(SandboxLimits(timeout_s=2.0), workers=2)
  probes = [p for p in CODE_PROBES if names is None or p[0] in names]
  with probe_env() as env:
    start = time.monotonic()
    jobs = [CodeJob(env.render(prog), PROBE_TESTS, "add") for _, prog, _ in probes]
    results: list[SandboxResult] = sandbox.run_many(jobs)
    wall = time.monotonic() - start
    leaks = env.leaks()
  outcomes = [ProbeOutcome(n, r.status, exp, r.duration_s) for (n, _, exp), r in zip(probes, results, strict=True)]
  return outcomes, leaks, wall


# --- labelled audits -----------------------------------------------------------------------------


@dataclasses.dataclass
class AuditReport:
  """False-positive / false-negative rates, disagreements and probe results of one verifier."""

  verifier: str
  positives: int = 0
  negatives: int = 0
  false_negatives: list[str] = dataclasses.field(default_factory=list)
  false_positives: list[str] = dataclasses.field(default_factory=list)
  faults: list[str] = dataclasses.field(default_factory=list)
  probes: int = 0
  probes_rewarded: list[str] = dataclasses.field(default_factory=list)
  leaks: list[str] = dataclasses.field(default_factory=list)
  layers: list[str] = dataclasses.field(default_factory=list)
  seconds: float = 0.0

  @property
  def fn_rate(self) -> float:
    return len(self.false_negatives) / max(1, self.positives)

  @property
  def fp_rate(self) -> float:
    return len(self.false_positives) / max(1, self.negatives)

  def summary(self) -> str:
    lines = [
      f"## {self.verifier}",
      f"positives {self.positives}, false negatives {len(self.false_negatives)} (FN rate {self.fn_rate:.4f})",
      f"negatives {self.negatives}, false positives {len(self.false_positives)} (FP rate {self.fp_rate:.4f})",
      f"verifier faults (masked, not scored) {len(self.faults)}",
      f"adversarial probes {self.probes}, wrongly rewarded {len(self.probes_rewarded)}; leaks {len(self.leaks)}",
      f"time {self.seconds:.1f}s",
    ]
    if self.layers:
      lines.append(f"sandbox layers: {', '.join(self.layers)}")
    for title, items in (
      ("false negatives", self.false_negatives), ("false positives", self.false_positives),
      ("faults", self.faults), ("wrongly rewarded probes", self.probes_rewarded), ("leaks", self.leaks),
    ):
      if items:
        lines.append(f"{title}:")
        lines += [f"  - {x}" for x in items[:50]]
    return "\n".join(lines)

  def to_json(self) -> dict:
    return {**dataclasses.asdict(self), "fn_rate": self.fn_rate, "fp_rate": self.fp_rate}


def _tally(report: AuditReport, label: bool, ident: str, result: RewardResult) -> None:
  if not result.valid:
    report.faults.append(f"{ident}: {result.status} {dict(result.info)}")
    return
  if label and result.score < 1.0:
    report.false_negatives.append(f"{ident}: {result.status} {dict(result.info)}"[:300])
  if not label and result.score > 0.0:
    report.false_positives.append(f"{ident}: {dict(result.info)}"[:300])


def change_final_number(reference: str, gold: str) -> str:
  """A GSM8K reference with its "#### x" answer replaced by x + 1."""
  head = reference.rsplit("####", 1)[0]
  return f"{head}#### {int(gold) + 1 if gold.lstrip('-').isdigit() else gold + '1'}"


def _restyle(reference: str, answer: str, style: str) -> str:
  """The reference with its final "#### x" line rewritten in another answer style."""
  head = reference.rsplit("####", 1)[0].rstrip()
  big = f"{int(answer):,}" if answer.lstrip("-").isdigit() else answer
  return head + "\n" + {
    "answer_is": f"The answer is {answer}.",
    "boxed": f"So the final answer is $\\boxed{{{answer}}}$",
    "currency": f"#### ${big}.00",
    "answer_colon": f"Answer: {big}",
  }[style]


def _wrong(answer: str) -> str:
  return str(int(answer) + 1) if answer.lstrip("-").isdigit() else answer + "1"


def audit_maths(n: int | None = None, workers: int = 1) -> AuditReport:
  """GSM8K test references, also restyled (positives), and the same with the final number changed (negatives)."""
  start = time.monotonic()
  report = AuditReport("maths (GSM8K test)")
  problems = GSM8KTask().test_problems(n)
  reward = MathsReward(workers=workers)
  cases = [
    (True, "reference", lambda p: p.reference),
    (False, "changed", lambda p: change_final_number(p.reference, p.answer)),
  ]
  for style in ("answer_is", "boxed", "currency", "answer_colon"):
    cases.append((True, style, lambda p, s=style: _restyle(p.reference, p.answer, s)))
    cases.append((False, style + ", wrong", lambda p, s=style: _restyle(p.reference, _wrong(p.answer), s)))
  for label, name, make in cases:
    for p, r in zip(problems, reward.batch(problems, [make(p) for p in problems]), strict=True):
      _tally(report, label, f"{p.id} ({name})", r)
    report.positives += len(problems) * label
    report.negatives += len(problems) * (not label)
  for name, gold, completion in MATHS_PROBES:
    r = reward(Problem(id=name, prompt="", answer=gold, task="gsm8k"), completion)
    report.probes += 1
    if r.score > 0:
      report.probes_rewarded.append(f"{name}: {completion[:60]!r}")
  report.seconds = time.monotonic() - start
  return report


def audit_arithmetic(n: int = 2000, config: MathsConfig | None = None) -> AuditReport:
  """Generated test problems: gold and worked forms (positives), off-by-one and padded answers (negatives)."""
  del config
  start = time.monotonic()
  report = AuditReport("arithmetic")
  task, worked = ArithmeticTask(), ArithmeticTask(worked=True)
  problems = task.test_problems(n)
  ok = lambda p, c: RewardResult(float(arithmetic.is_correct(p, c)), "ok", {"completion": c})
  for p in problems:
    for c in (p.answer, worked.make_problem(p.prompt[:-1], p.difficulty).reference, f" {p.answer}\n"):
      report.positives += 1
      _tally(report, True, p.prompt, ok(p, c))
    for c in (str(int(p.answer) + 1), p.answer + "0", f"{p.answer} {p.answer}", f"{p.answer}.0"):
      report.negatives += 1
      _tally(report, False, p.prompt, ok(p, c))
  probe = task.make_problem("12+7*3", 3)
  for name, completion in ARITHMETIC_PROBES:
    report.probes += 1
    if arithmetic.is_correct(probe, completion):
      report.probes_rewarded.append(f"{name}: {completion!r}")
  report.seconds = time.monotonic() - start
  return report


BROKEN_BODIES = {"pass": "    pass\n", "return_none": "    return None\n", "wrong_constant": "    return 0\n"}


def audit_code(n: int | None = None, workers: int = 2, timeout_s: float = 10.0) -> AuditReport:
  """HumanEval canonical solutions (positives), broken bodies (negatives), and the code probes."""
  start = time.monotonic()
  report = AuditReport(f"code (HumanEval, {workers} workers)")
  problems = HumanEvalTask().test_problems(n)
  sandbox = Sandbox(SandboxLimits(timeout_s=timeout_s), workers=workers)

  def result(r: SandboxResult) -> RewardResult:
    return RewardResult(float(r.passed), r.status, {"detail": r.detail[:200]})

  canonical = sandbox.run_many([job_for(p, p.reference) for p in problems])
  report.layers = list(canonical[0].layers) if canonical else []
  for p, r in zip(problems, canonical, strict=True):
    _tally(report, True, p.id, result(r))
  for kind, body in BROKEN_BODIES.items():
    for p, r in zip(problems, sandbox.run_many([job_for(p, body) for p in problems]), strict=True):
      _tally(report, False, f"{p.id} ({kind})", result(r))
  report.positives, report.negatives = len(problems), len(problems) * len(BROKEN_BODIES)
  outcomes, leaks, _ = run_code_probes(Sandbox(SandboxLimits(timeout_s=2.0), workers=workers))
  report.probes = len(outcomes)
  report.probes_rewarded = [f"{o.name}: {o.status}" for o in outcomes if o.wrongly_rewarded]
  report.leaks = leaks
  report.seconds = time.monotonic() - start
  return report


def main(argv: list[str] | None = None) -> int:
  """CLI; exit status 1 if any false positive, wrongly rewarded probe or leak was found."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--verifier", choices=["maths", "code", "arithmetic", "all"], default="all")
  parser.add_argument("--n", type=int, default=None, help="number of problems (default: all / 2000 for arithmetic)")
  parser.add_argument("--workers", type=int, default=2, help="parallel sandboxes / maths workers")
  parser.add_argument("--timeout_s", type=float, default=10.0, help="per-program wall-clock limit (code)")
  parser.add_argument("--json", default=None, help="also write the reports to this JSON file")
  args = parser.parse_args(argv)
  chosen = ["arithmetic", "maths", "code"] if args.verifier == "all" else [args.verifier]
  reports = []
  for name in chosen:
    if name == "arithmetic":
      reports.append(audit_arithmetic(args.n or 2000))
    elif name == "maths":
      reports.append(audit_maths(args.n, workers=1))
    else:
      reports.append(audit_code(args.n, args.workers, args.timeout_s))
    print(reports[-1].summary(), flush=True)
    print()
  if args.json:
    Path(args.json).write_text(json.dumps([r.to_json() for r in reports], indent=2))
  bad = any(r.false_positives or r.probes_rewarded or r.leaks for r in reports)
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
