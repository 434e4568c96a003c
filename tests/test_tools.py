"""The tools an environment offers (rl_lm/envs/tools.py): the call grammar, the exact calculator and its limits,
the Python tool in the code sandbox. A tool's errors are observations; only its infrastructure failing raises."""

import pytest

from rl_lm.envs import tools

CALC = ("calc",)


@pytest.mark.parametrize("turn, kind, name, args", [
  ("[calc(347*862)]", "call", "calc", "347*862"),
  ("  [calc(1 + 2)]\n", "call", "calc", "1 + 2"),
  ("[calc((1+2)*(3+4))]", "call", "calc", "(1+2)*(3+4)"),  # the arguments run to the final ")]"
  ("[calc(347*862", "malformed", "calc", ""),
  ("[calc 347*862]", "malformed", "calc", ""),
  ("[calc(1+2)] so 3", "malformed", "calc", ""),  # text after the call
  ("[search(cats)]", "malformed", "search", ""),  # not a tool this environment offers
  ("299114", "answer", "", ""),
  ("the answer is [3]", "answer", "", ""),
])
def test_call_grammar(turn, kind, name, args):
  call = tools.parse(turn, CALC)
  assert (call.kind, call.name, call.arguments) == (kind, name, args)
  assert bool(call.malformed) == (kind == "malformed")


def test_python_call_keeps_brackets_and_newlines():
  call = tools.parse("[python(xs = [1, 2]\nprint(sum(xs)))]", ("python",))
  assert call.kind == "call" and call.arguments == "xs = [1, 2]\nprint(sum(xs))"


@pytest.mark.parametrize("expression, output", [
  ("347*862", "299114"), ("7/2", "3.5"), ("1/3", "0.3333333333"), ("-(2-5)**3", "27"), ("10//3 + 10 % 3", "4"),
  ("0.1 + 0.2", "0.3"),  # exact: no binary floating-point error
  ("123456789 * 987654321", "121932631112635269"),
])
def test_calculator_is_exact(expression, output):
  assert tools.calculator(expression) == tools.ToolResult(output)


@pytest.mark.parametrize("expression, reason", [
  ("1/0", "division by zero"), ("0**-1", "division by zero"), ("5 % 0", "division by zero"),
  ("2**1000", "integer exponent"),  # bounded: a call cannot make the tool spin
  ("9**64 * 9**64", "digits"),
  ("__import__('os').system('true')", "not arithmetic"), ("(1).__class__", "not arithmetic"),
  ("x + 1", "not arithmetic"),
  ("1 +", "syntax error"), ("1" * 300, "longer than"),
])
def test_calculator_refuses_with_an_error_observation(expression, reason):
  result = tools.calculator(expression)
  assert result.error and result.output.startswith("error: ") and reason in result.output


@pytest.mark.parametrize("expression, output", [
  ("é + 1", "error: not arithmetic: '\\xe9'"),  # the echo of the policy's text is escaped: ASCII
  ("'\ufffd'", "error: not arithmetic: \"'\\ufffd'\""),
  ("\udcff", "error: 'utf-8' codec can't encode character '\\udcff' in position 0: surrogates not allowed"),
  ("1\x00", "error: syntax error"),
  ("'\\q'", "error: not arithmetic: \"'\\\\\\\\q'\""),  # an invalid escape: no warning reaches our stderr
])
def test_calculator_output_is_ascii_whatever_the_expression(expression, output, recwarn):
  result = tools.calculator(expression)
  assert result == tools.ToolResult(output, error=True) and result.output.isascii() and not recwarn.list


def test_python_tool_output_is_visible_text():
  """What the sandbox hands back (a surrogate in an exception's message, NULs and escapes on stdout) reaches the
  policy as valid Unicode with control characters escaped."""
  from rl_lm.rewards.code import SandboxResult

  class Fake:
    def __init__(self, result):
      self.result = result

    def run(self, job):
      return self.result

  raised = SandboxResult("runtime_error", 0.1, "ValueError: \udcff\x1b[2J", stdout="a\x00b\n")
  assert tools.PythonTool(sandbox=Fake(raised))("x") == tools.ToolResult(
    "a\\x00b\nerror: ValueError: \ufffd\\x1b[2J", error=True)
  huge = SandboxResult("passed", 0.1, stdout="\x07" * 5000)
  assert tools.PythonTool(sandbox=Fake(huge))("x") == tools.ToolResult("\\x07" * 100)  # the last 400 characters


@pytest.fixture(scope="module")
def python_tool():
  return tools.PythonTool(timeout_s=2.0)


def test_python_tool_returns_stdout(python_tool):
  assert python_tool("print(sum(range(10)))") == tools.ToolResult("45\n")


@pytest.mark.parametrize("program, needle", [
  ("print(1)\nprint(1/0)", "ZeroDivisionError"),
  ("print((", "syntax error"),
  ("import socket\nsocket.create_connection(('127.0.0.1', 9))", "error"),  # no network in the jail
])
def test_python_tool_errors_are_observations(python_tool, program, needle):
  result = python_tool(program)
  assert result.error and needle in result.output


def test_python_tool_spin_is_a_timeout_observation_or_a_masked_overload(python_tool):
  """A spinning program that got its CPU time is the model's doing: a timeout observation. On a host so loaded that
  it mostly waited (CI's other worker compiling), the same spin is the infrastructure's doing: ToolInfraError, which
  the environment masks. Which one happens depends on the host's load, never on luck in the classification."""
  try:
    result = python_tool("while True:\n    pass")
  except tools.ToolInfraError as e:
    assert "overloaded" in str(e) and "waiting" in str(e)
  else:
    assert result.error and "timeout" in result.output


def test_python_tool_cannot_read_the_host(python_tool):
  result = python_tool("print(open('/etc/hostname').read())")
  assert result.error  # the jail's file system has no /etc/hostname (and the fallback's audit hook refuses it)


def test_python_tool_infrastructure_failure_raises():
  class Broken:
    def run(self, job):
      from rl_lm.rewards.code import SandboxResult

      return SandboxResult("sandbox_error", 0.0, "could not start")

  with pytest.raises(tools.ToolInfraError, match="sandbox_error"):
    tools.PythonTool(sandbox=Broken())("print(1)")
