"""A DSpark head folder's confidence calibration (calibration.json): the per-position temperatures
jspec.confidence.fit_temperatures finds, read when the head is built with confidence_schedule."""

from __future__ import annotations

import json
import os

import numpy as np

from jspec.io import atomic_write_text

CALIBRATION = "calibration.json"


def save_calibration(folder: str, temperatures, *, ece_before=None, ece_after=None,
                     source: str = "") -> str:
  path = os.path.join(folder, CALIBRATION)
  atomic_write_text(path, json.dumps(dict(
      temperatures=[float(t) for t in temperatures], source=source,
      ece_before=None if ece_before is None else [float(x) for x in ece_before],
      ece_after=None if ece_after is None else [float(x) for x in ece_after]), indent=2) + "\n")
  return path


def read_calibration(folder: str | None, num: int) -> np.ndarray:
  """The head folder's per-position temperatures (num of them: the last repeats past its length),
  or ones where the folder has no calibration.json."""
  path = None if folder is None else os.path.join(folder, CALIBRATION)
  if path is None or not os.path.isfile(path):
    return np.ones(num, np.float32)
  try:
    with open(path) as f:
      t = [float(x) for x in json.load(f)["temperatures"]]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f"{path} is not a confidence calibration ({e}); delete it or re-run the "
                     "calibration") from None
  if not t or min(t) <= 0:
    raise ValueError(f"{path}: temperatures must be positive, got {t}")
  t = (t + [t[-1]] * num)[:num]
  return np.asarray(t, np.float32)
