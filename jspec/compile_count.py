"""Counts XLA backend compilations, to prove steady-state decoding never recompiles."""

from __future__ import annotations

import contextlib
import threading

import jax

_EVENT = "/jax/core/compile/backend_compile_duration"
_lock = threading.Lock()
_count = 0
_installed = False


def _listener(event: str, duration: float, **kwargs) -> None:
  global _count
  if event == _EVENT:
    with _lock:
      _count += 1


def compiles_so_far() -> int:
  global _installed
  if not _installed:
    jax.monitoring.register_event_duration_secs_listener(_listener)
    _installed = True
  return _count


class _Counter:
  def __init__(self):
    self.start = compiles_so_far()
    self.end = None

  @property
  def count(self) -> int:
    return (self.end if self.end is not None else compiles_so_far()) - self.start


@contextlib.contextmanager
def count_compiles():
  """`with count_compiles() as c: ...; c.count` = backend compilations inside the block."""
  c = _Counter()
  try:
    yield c
  finally:
    c.end = compiles_so_far()
