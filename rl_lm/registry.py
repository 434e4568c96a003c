"""One registry style for every part chosen by name: policy losses, advantage estimators, rewards, environments,
tasks and stages (as verl's `register_policy_loss`).

  LOSSES = Registry("policy loss", "policy losses")

  @LOSSES.register("my_loss")        # config.rl.policy_loss = "my_loss" now selects it
  def my_loss(...): ...

  LOSSES.get("my_loss")              # or LOSSES["my_loss"]; an unknown name raises UnknownNameError
  LOSSES.names()                     # the registered names, sorted (iterating LOSSES gives the same)

A name is registered once: a second, different value under it is refused, since two plug-ins claiming one name
is a bug whichever wins (registering the same value again, as a module imported twice does, is a no-op). The
config reads its allowed choices from the registries (`Registry.problem` is a knob's check, see
rl_lm/config/section.py), so a decorated plug-in is a valid config value as soon as its module is imported,
e.g. by the config file that selects it.

The value stored is whatever the kind needs: a function, a factory, a class, a record of the function and its
properties (policy losses, advantage estimators), or where another process finds it (environments keep
(module, qualname), since workers build them in their own processes). `load`, when given, imports the modules
that register the built-ins before the first lookup, for kinds whose built-ins import the registry rather than
the other way round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
  """A name nobody registered; its one-line message names the kind and lists the known names.

  A KeyError (a failed lookup) and a ValueError (a bad value, usually a config's), as numpy's AxisError is both
  an IndexError and a ValueError. `rl_lm.main` reports it as one line: the name came from the user.
  """

  user_facing = True

  def __str__(self) -> str:  # KeyError's own would quote the message
    return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
  """Names -> values of one kind (see the module docstring)."""

  def __init__(self, kind: str, plural: str = "", error: type[UnknownNameError] = UnknownNameError,
               load: Callable[[], None] | None = None) -> None:
    self.kind, self.plural = kind, plural or f"{kind}s"
    self._error, self._load = error, load
    self._entries: dict[str, T] = {}

  def add(self, name: str, value: T) -> None:
    """Registers `value` under `name`; ValueError if the name holds another value."""
    if not isinstance(name, str) or not name:
      raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")
    if name in self._entries and self._entries[name] is not value and self._entries[name] != value:
      raise ValueError(f"{self.kind} {name!r} is already registered")
    self._entries[name] = value

  def register(self, name: str) -> Callable[[T], T]:
    """Decorator: registers what it decorates under `name` and returns it unchanged."""

    def wrap(value: T) -> T:
      self.add(name, value)
      return value

    return wrap

  def get(self, name: str) -> T:
    """The value registered under `name`; raises the registry's UnknownNameError listing the known names."""
    problem = self.problem(name)
    if problem is not None:
      raise self._error(problem)
    return self._entries[name]

  __getitem__ = get

  def names(self) -> tuple[str, ...]:
    """The registered names, sorted (the built-ins included)."""
    self._load_builtins()
    return tuple(sorted(self._entries))

  def problem(self, name: Any) -> str | None:
    """What is wrong with `name` as a choice of this kind: None when it is registered, else one line naming the
    known ones. A config knob's check (`knob(default, REGISTRY.problem)`)."""
    if name in self:
      return None
    return f"unknown {self.kind} {name!r}; known {self.plural}: {', '.join(self.names()) or 'none'}"

  def __contains__(self, name: object) -> bool:
    self._load_builtins()
    return isinstance(name, str) and name in self._entries

  def __iter__(self) -> Iterator[str]:
    return iter(self.names())

  def __len__(self) -> int:
    return len(self.names())

  def __repr__(self) -> str:
    return f"Registry({self.kind!r}: {', '.join(self.names())})"

  def _load_builtins(self) -> None:
    if self._load is not None:
      load, self._load = self._load, None  # cleared first: the modules it imports register through this registry
      try:
        load()
      except BaseException:
        self._load = load  # try again at the next lookup rather than go on without the built-ins
        raise
