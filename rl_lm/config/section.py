"""A config section: a frozen dataclass whose every field holds its default, its comment and its check.

    decay: float = knob(0.9, "(0, 1]")  # per-update decay of a prompt's Beta counts

`knob(default, allowed)` takes an interval ("[0, inf)"; a closing "inf]" lets the field be +inf), a tuple
of choices, or a function saying what is wrong with a value (None when nothing is). A choice of a registered
part (a policy loss, an advantage estimator, a task, a stage...) takes its registry's `problem`, or
`registered(module, attribute)` where importing the registry must wait for the check, so that whatever is
registered by then (rl_lm/registry.py) is a valid value. An int field must hold an int. Rules between the
fields of one section go in its `check()`. Building a section checks it and raises ConfigError with the full key
(`config.rl.curriculum.decay`); `from_section` builds one from its ConfigDict and `config_dict` gives the
defaults as one.
"""

from __future__ import annotations

import dataclasses
import importlib
import numbers
import os
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Self

import ml_collections

Allowed = str | tuple | Callable[[Any], str | None]  # an interval, choices, or a function (see above)


class ConfigError(ValueError):
  """An invalid configuration value. `key` is the dotted path, e.g. 'config.mesh.data'."""

  def __init__(self, key: str, message: str):
    super().__init__(f"{key}: {message}")
    self.key = key


def knob(default: Any, allowed: Allowed) -> Any:
  """A section field: its default and the values it allows (see the module docstring)."""
  return dataclasses.field(default=default, metadata={"allowed": allowed})


def folder(path: str) -> str | None:
  """Allows "" (none) or an existing folder."""
  return None if not path or os.path.isdir(path) else f"no such folder {path!r}"


def registered(module: str, attribute: str) -> Callable[[Any], str | None]:
  """Allows the names registered in the Registry `module.attribute` (rl_lm/registry.py), importing the module at
  the first check: tasks, rewards, environments and stages load more than a config module should on import."""

  def problem(name: Any) -> str | None:
    return getattr(importlib.import_module(module), attribute).problem(name)

  return problem


def _problem(value: Any, allowed: Allowed | None, integer: bool) -> str | None:
  """What is wrong with `value` under `allowed`; None when nothing is."""
  if allowed is None:
    return None
  if callable(allowed):
    return allowed(value)
  if isinstance(allowed, tuple):
    return None if value in allowed else f"must be one of {', '.join(map(repr, allowed))}, got {value!r}"
  if isinstance(value, bool) or not isinstance(value, int if integer else numbers.Real):
    return f"must be {'an integer' if integer else 'a number'}, got {value!r}"
  low_text, high_text = (s.strip() for s in allowed[1:-1].split(","))
  low, high, low_open, high_open = float(low_text), float(high_text), allowed[0] == "(", allowed[-1] == ")"
  if (value > low if low_open else value >= low) and (value < high if high_open else value <= high):
    return None
  text = f"{'>' if low_open else '>='} {low_text}" if allowed.endswith("inf)") else f"in {allowed}"
  return f"must be {text}, got {value!r}"


@dataclasses.dataclass(frozen=True)
class Section:
  """Base of every config section; see the module docstring."""

  KEY: ClassVar[str] = ""  # where the section sits under `config`, e.g. "rl.curriculum"; "": the top level
  STAGES: ClassVar[tuple[str, ...]] = ()  # validate() checks the section only when one of these runs; (): always

  def __post_init__(self) -> None:
    for f in dataclasses.fields(self):
      message = _problem(getattr(self, f.name), f.metadata.get("allowed"), f.type in (int, "int"))
      self.require(message is None, f.name, message)
    self.check()

  def check(self) -> None:
    """Rules between this section's fields; a section overrides it and fails through `require`."""

  def require(self, ok: bool, name: str, message: str | None) -> None:
    """Raises ConfigError naming config.<KEY>.<name> unless `ok`."""
    if not ok:
      raise ConfigError(".".join(p for p in ("config", self.KEY, name) if p), message)

  @classmethod
  def from_section(cls, node: ml_collections.ConfigDict, **given: Any) -> Self:
    """The section built from its ConfigDict by field name (nested sections too), plus the `given` fields."""

    def value(f: dataclasses.Field) -> Any:
      v = node[f.name]
      if _nested(f):
        return f.default_factory.from_section(v)
      return v.to_dict() if isinstance(v, ml_collections.ConfigDict) else v

    return cls(**{f.name: value(f) for f in dataclasses.fields(cls) if f.name not in given}, **given)

  @classmethod
  def config_dict(cls) -> ml_collections.ConfigDict:
    """Every field with its default, nested sections as ConfigDicts."""

    def default(f: dataclasses.Field) -> Any:
      if f.default is not dataclasses.MISSING:
        return f.default
      return f.default_factory.config_dict() if _nested(f) else f.default_factory()

    return ml_collections.ConfigDict({f.name: default(f) for f in dataclasses.fields(cls)})

  @classmethod
  def inf_keys(cls) -> Iterator[str]:
    """The dotted keys of the fields (nested sections' too) that may be +inf."""
    for f in dataclasses.fields(cls):
      if _nested(f):
        yield from f.default_factory.inf_keys()
      elif str(f.metadata.get("allowed")).endswith("inf]"):
        yield ".".join(p for p in (cls.KEY, f.name) if p)


def _nested(f: dataclasses.Field) -> bool:
  return isinstance(f.default_factory, type) and issubclass(f.default_factory, Section)
