"""Tools an environment offers the policy, and the grammar of a call in the policy's text.

The call grammar. A turn is a tool call when its whole text (surrounding whitespace aside) reads

  [name(arguments)]

with `name` a registered tool (lower-case letters, digits, `_`) and `arguments` everything between the first
`(` and the final `)]`: any text, newlines and brackets included (so `[python(print([1, 2]))]` calls python
with `print([1, 2])`). One call per turn; the tool's output comes back as the next observation. A turn that
starts with `[` followed by a tool's name but is not a complete call (`[calc(1+2`, `[calc 1+2]`, text after
the `)]`) is a malformed call: the policy's mistake, not the environment's. Any other turn is an answer.

Tools. `calculator` evaluates + - * / // % ** and parentheses over integers and decimals, exactly (Python
integers and `fractions.Fraction`, shown as an integer or a decimal), with bounded operand sizes so a call
cannot make it spin. `python` runs a program in the code sandbox (rl_lm/rewards/code.py: the jail, rlimits, a
wall-clock limit) and returns its standard output. A tool's error (a division by zero, a syntax error, a
program that raised or ran out of time) is an observation the policy reads: `ToolResult.error`. Only the tool's
own infrastructure failing (the sandbox would not start, the host starved it) raises `ToolInfraError`, which
the episode runner counts as an environment failure.

Hostile text. A tool's output is a function of the policy's input, so the policy can steer it anywhere: a
program prints bytes that are not UTF-8, NULs or escape sequences, raises with a lone surrogate in its message,
prints megabytes; an expression holds characters outside any small alphabet. So every `ToolResult.output` is
`text.visible` (valid Unicode, control characters escaped, bounded: the Python tool keeps its last `max_output`
characters), and the calculator's is ASCII: it echoes the policy's expression only through `ascii()` escapes,
so even the character tokenizer frames every calculator observation. No input makes a tool raise but
`ToolInfraError` (tests/test_episode_fuzz.py feeds them random bytes, surrogates, control characters and huge
strings). Whatever still cannot be framed is the episode runner's to classify (rl_lm/envs/episodes.py).
"""

from __future__ import annotations

import ast
import dataclasses
import fractions
import operator
import re
import warnings
from collections.abc import Callable

from rl_lm.envs import text as text_lib
from rl_lm.rewards import code as code_lib


class ToolInfraError(RuntimeError):
  """The tool itself failed (not the policy's input): an environment failure."""


@dataclasses.dataclass(frozen=True)
class Call:
  """A parsed turn: a tool call (`name`, `arguments`), a malformed call (`malformed` says why), or an answer."""

  kind: str  # "call" | "malformed" | "answer"
  name: str = ""
  arguments: str = ""
  malformed: str = ""


@dataclasses.dataclass(frozen=True)
class ToolResult:
  output: str  # what the policy reads
  error: bool = False  # the call failed for a reason of its own (bad expression, the program raised)


_CALL = re.compile(r"\[([a-z][a-z0-9_]*)\((.*)\)\]", re.S)
_START = re.compile(r"\[([a-z][a-z0-9_]*)")


def parse(turn: str, tools: tuple[str, ...]) -> Call:
  """The grammar of the module docstring: what `turn` is, given the tools an environment offers."""
  text = turn.strip()
  whole = _CALL.fullmatch(text)
  if whole and whole.group(1) in tools:
    return Call("call", whole.group(1), whole.group(2))
  start = _START.match(text)
  if start and start.group(1) in tools:
    return Call("malformed", start.group(1), malformed=f"not a complete call [{start.group(1)}(...)]: {text[:60]!r}")
  if whole:
    return Call("malformed", whole.group(1), malformed=f"unknown tool {whole.group(1)!r}; tools: {', '.join(tools)}")
  return Call("answer")


# --- calculator -----------------------------------------------------------------------------------

_BINARY: dict[type, Callable] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                                 ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
                                 ast.Pow: operator.pow}
MAX_DIGITS = 60  # operands and results beyond this many digits are refused: a call cannot make the tool spin
MAX_CHARS = 200


def _number(x: fractions.Fraction) -> str:
  if x.denominator == 1:
    return str(x.numerator)
  text = f"{float(x):.10g}"
  return text if "e" not in text else str(float(x))


def _digits(x: fractions.Fraction) -> int:
  return max(len(str(abs(x.numerator))), len(str(x.denominator)))


def _evaluate(node: ast.AST) -> fractions.Fraction:
  if isinstance(node, ast.Expression):
    return _evaluate(node.body)
  if isinstance(node, ast.Constant) and type(node.value) in (int, float):
    return fractions.Fraction(str(node.value))
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
    x = _evaluate(node.operand)
    return -x if isinstance(node.op, ast.USub) else x
  if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
    a, b = _evaluate(node.left), _evaluate(node.right)
    if isinstance(node.op, ast.Pow):
      if b.denominator != 1 or abs(b) > 64:
        raise ValueError("powers take an integer exponent of at most 64")
      if b < 0 and a == 0:
        raise ZeroDivisionError("division by zero")
      out = a ** int(b)
    else:
      if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and b == 0:
        raise ZeroDivisionError("division by zero")
      out = _BINARY[type(node.op)](a, b)
      out = fractions.Fraction(out)
    if _digits(out) > MAX_DIGITS:
      raise ValueError(f"result beyond {MAX_DIGITS} digits")
    return out
  raise ValueError(f"not arithmetic: {ascii(ast.unparse(node)[:40])}")  # ascii(): the echo stays ASCII


def calculator(expression: str) -> ToolResult:
  """Exact arithmetic on `expression` (the module docstring's operators); errors as text. The output is ASCII
  whatever the expression holds."""
  if len(expression) > MAX_CHARS:
    return ToolResult(f"error: expression longer than {MAX_CHARS} characters", error=True)
  try:
    with warnings.catch_warnings():  # "invalid escape sequence" and the like: the policy's text, not our stderr
      warnings.simplefilter("ignore")
      tree = ast.parse(expression.strip(), mode="eval")
    return ToolResult(_number(_evaluate(tree)))
  except ZeroDivisionError:
    return ToolResult("error: division by zero", error=True)
  except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError, OverflowError) as e:
    # ValueError covers a NUL or a lone surrogate in the source (ast.parse refuses both); MemoryError and
    # RecursionError a parser pushed too deep. The messages are ours or Python's, escaped to ASCII regardless.
    reason = "syntax error" if isinstance(e, SyntaxError) else str(e) or type(e).__name__
    return ToolResult(f"error: {_ascii(reason)}", error=True)


def _ascii(message: str) -> str:
  """`message` in printable ASCII and newlines (the character tokenizer's alphabet): control characters, tabs and
  everything past ASCII as escapes."""
  return text_lib.visible(message).replace("\t", "\\x09").encode("ascii", "backslashreplace").decode("ascii")


# --- python, in the code sandbox -------------------------------------------------------------------

_ENTRY = "__tool_program_done"


class PythonTool:
  """Runs a program in the code sandbox and returns its standard output (the last `max_output` characters)."""

  def __init__(self, timeout_s: float = 5.0, max_output: int = 400, sandbox: code_lib.Sandbox | None = None):
    self.sandbox = sandbox or code_lib.Sandbox(code_lib.SandboxLimits(timeout_s=timeout_s, memory_bytes=512 << 20))
    self.max_output = max_output

  def __call__(self, program: str) -> ToolResult:
    """The program's standard output, or its error, as `text.visible` text of at most about `max_output` + 200
    characters. The sandbox decodes the program's output with U+FFFD for bytes that are not UTF-8; its error
    detail can still carry lone surrogates (a program's exception message, through JSON) and control characters,
    which are made visible here."""
    program = text_lib.well_formed(program)  # a surrogate cannot be written to the program's file
    job = code_lib.CodeJob(program=f"{program}\n\ndef {_ENTRY}():\n    return 0\n", tests="", entry_point=_ENTRY,
                           check_call="assert candidate() == 0")
    result = self.sandbox.run(job)
    if result.status in code_lib.MASKED_STATUSES:  # the sandbox failed, or the host starved the program
      raise ToolInfraError(f"python tool: {result.status}: {text_lib.visible(result.detail[:200])}")
    out = text_lib.visible(result.stdout)[-self.max_output:]
    if result.status == "passed":
      return ToolResult(out)
    if result.status == "syntax_error":
      return ToolResult("error: syntax error", error=True)
    if result.status == "timeout":
      return ToolResult(f"{out}error: timeout".strip(), error=True)
    lines = [x for x in result.stderr.strip().splitlines() if x.strip()]
    reason = text_lib.visible(result.detail or (lines[-1] if lines else result.status))
    return ToolResult(f"{out}error: {reason[-200:]}".strip(), error=True)
