"""Ctrl-C that is never lost: SIGINT raises KeyboardInterrupt even where Python would discard it, a second
Ctrl-C leaves at once, and a process an interrupt stopped leaves within `EXIT_GRACE_S`."""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import types

EXIT_GRACE_S = 30.0  # after an interrupt, the longest the shutdown may wait (unfinished saves, uploads, threads)


class Interrupts:
  """SIGINT handling: KeyboardInterrupt as usual, but never lost, and a second Ctrl-C leaves at once.

  Python raises KeyboardInterrupt at the first bytecode the main thread runs after the signal. When that
  bytecode is in a garbage-collector callback (JAX registers one, run at the start and end of every
  collection: a signal that arrives during a collection is handled there), a `__del__` or a weakref
  callback, Python discards the exception ("Exception ignored in ...") and the run goes on as if never
  interrupted. `sys.unraisablehook` sees each interrupt so discarded, and a helper thread delivers it again
  (`_thread.interrupt_main`) once the hook has returned, to be raised at the main thread's next bytecode.
  """

  def __init__(self) -> None:
    self.count = 0  # Ctrl-Cs received (a redelivery is not a new one)
    self.redelivering = False
    self._lost = threading.Event()
    self._next_hook = sys.unraisablehook

  def install(self) -> None:
    """Takes over SIGINT and the unraisable-exception hook (main thread only)."""
    signal.signal(signal.SIGINT, self._on_signal)
    self._next_hook = sys.unraisablehook
    sys.unraisablehook = self._on_unraisable
    threading.Thread(target=self._redeliver, name="rl_lm-interrupts", daemon=True).start()

  def _on_signal(self, signum: int, frame: types.FrameType | None) -> None:
    if self._in_hook(frame):  # raised here, it would be discarded too: deliver it again afterwards
      self._lost.set()
      return
    if self.redelivering:
      self.redelivering = False
    else:
      self.count += 1
      if self.count > 1:  # the user insists: whatever the shutdown waits for, leave now
        print("rl_lm: interrupted again: stopped at once", file=sys.stderr, flush=True)
        os._exit(130)
    raise KeyboardInterrupt

  def _on_unraisable(self, unraisable: sys.UnraisableHookArgs) -> None:
    if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
      self._lost.set()
    else:
      self._next_hook(unraisable)

  def _in_hook(self, frame: types.FrameType | None) -> bool:
    while frame is not None:
      if frame.f_code is Interrupts._on_unraisable.__code__:
        return True
      frame = frame.f_back
    return False

  def _redeliver(self) -> None:
    while True:
      self._lost.wait()
      self._lost.clear()
      self.redelivering = True
      _thread.interrupt_main(signal.SIGINT)


def exit_with(code: int) -> None:
  """sys.exit(code), through the normal shutdown, but a process that an interrupt stopped leaves within
  EXIT_GRACE_S even when a non-daemon thread or an atexit handler waits on (a save, an upload)."""
  if code == 130:
    timer = threading.Timer(EXIT_GRACE_S, os._exit, args=(code,))
    timer.daemon = True
    timer.start()
  sys.exit(code)
