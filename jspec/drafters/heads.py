"""Head folders shared by every learned drafter: the layout (config.json + model.safetensors +
checksums.json, weights in torch's [out, in] layout with HF names), the checks made on load, the
draft-vocabulary maps, and the one manifest of heads shipped with the package.

Each method's own format (its config keys and tensor names) lives in `<method>/checkpoint.py`.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jspec.io import atomic_write_bytes
from models.config import LlamaConfig
from models.fetch import sha256_of

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
CHECKSUMS = "checksums.json"
HEADS_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "heads")
_SHAPE = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
          "num_kv_heads", "head_dim")


class HeadLoadError(ValueError):
  """A head checkpoint that cannot be used (missing files, wrong shapes, wrong checksum)."""


def target_shape(target: LlamaConfig) -> dict:
  """The fields that identify a target for a shipped head."""
  return {k: getattr(target, k) for k in _SHAPE}


_SMOLLM2_135M = target_shape(LlamaConfig.smollm2_135m())

# Heads shipped with the package: (method, the target's shape, folder under jspec/heads, weights
# sha256). SmolLM2-135M-Instruct; recipes, budgets and measurements in docs/training.md and
# benchmarks/REPORT.md.
SHIPPED: list[tuple[str, dict, str, str]] = [
    ("eagle3", _SMOLLM2_135M, "smollm2-135m-instruct-eagle3",
     "7d6d78cab9705eecc5950fc42cc874ea6d73aaba9917738ba588624ccdf2c49a"),
    ("medusa", _SMOLLM2_135M, "smollm2-135m-instruct-medusa",
     "ed31ad61f403ccd78dbc1e3535cdd5c7032df19af8fc697281098917e42bda80"),
    ("mtp", _SMOLLM2_135M, "smollm2-135m-instruct-mtp",
     "261b69d66726d023301da519e55ff2428af083dd1bc6220e746b3a0684cb30ef"),
    ("dflash", _SMOLLM2_135M, "smollm2-135m-instruct-dflash",
     "4b15b7f1b94d6f67b39a6c0e88dbc1023ad72006683435494b7c00817ee4720c"),
    ("dspark", _SMOLLM2_135M, "smollm2-135m-instruct-dspark",
     "448af051a554e435065c0e47ee62c39cdb3affe0408ecdecc0ecfd86823f8eaf"),
]

# What to pass when no head is shipped for a target: method -> the sentence's end.
_HOW = {
    "eagle3": ("EAGLE-3 head", "head=PATH (--head PATH), e.g. one trained with `jspec train "
               "eagle3`"),
    "medusa": ("Medusa head", "head=PATH (--medusa-head PATH), e.g. one trained with `jspec "
               "train medusa`"),
    "mtp": ("MTP module", "head=PATH (--mtp-head PATH), e.g. one trained with `jspec train mtp`, "
            "or checkpoint=FOLDER (--mtp-checkpoint) for a checkpoint with MTP layers"),
    "dflash": ("dflash head", "head=PATH (--dflash-head PATH), e.g. one trained with `jspec "
               "train dflash`"),
    "dspark": ("dspark head", "head=PATH (--dspark-head PATH), e.g. one trained with `jspec "
               "train dspark`"),
}


def shipped(method: str, target: LlamaConfig) -> tuple[str, str] | None:
  """(folder, weights sha256) of the `method` head shipped for a target of this shape, if any."""
  for kind, shape, folder, sha in SHIPPED:
    if kind == method and all(getattr(target, k) == v for k, v in shape.items()):
      return os.path.join(HEADS_DIR, folder), sha
  return None


def shipped_head(method: str, target: LlamaConfig) -> tuple[str, str]:
  """(folder, weights sha256) of the head shipped for `target`, or a clear error saying how to
  get one."""
  found = shipped(method, target)
  if found is None:
    what, how = _HOW[method]
    raise HeadLoadError(f"no {what} is shipped for this target model; pass one with {how}")
  return found


def check_sums(folder: str, expected_sha256: str | None) -> None:
  """Checks the folder's files against its checksums.json and the weights against
  expected_sha256 (a shipped head's); raises HeadLoadError on a mismatch."""
  sums_path = os.path.join(folder, CHECKSUMS)
  expected = {}
  if os.path.isfile(sums_path):
    with open(sums_path) as f:
      expected = json.load(f)
  if expected_sha256 is not None:
    expected[WEIGHTS] = expected_sha256
  for name, want in expected.items():
    got = sha256_of(os.path.join(folder, name))
    if got != want:
      raise HeadLoadError(f"{os.path.join(folder, name)} has sha256 {got}, expected {want}: the "
                          "file is corrupt or was changed; restore or re-export the head")


def read_weights(folder: str, what: str, expected_sha256: str | None) -> tuple[str, dict]:
  """(path, tensors) of a head folder's weights, read after its checksums are verified;
  HeadLoadError for a missing, changed or unreadable file. what: e.g. "an MTP head folder"."""
  from safetensors.numpy import load_file

  wpath = os.path.join(folder, WEIGHTS)
  if not os.path.isfile(wpath):
    raise HeadLoadError(f"{wpath} is missing ({what} holds {CONFIG} and {WEIGHTS})")
  check_sums(folder, expected_sha256)
  try:
    return wpath, load_file(wpath)
  except Exception as e:   # safetensors raises its own error types for a malformed file
    raise HeadLoadError(f"{wpath} cannot be read as safetensors: {e}") from None


def fill(make, names: dict, tensors, where: str, dtype, fixed: dict | None = None):
  """The nnx module `make()` builds, with its parameters read from HF-named tensors and nothing
  computed: `names` maps a parameter path to its tensor name (kernels are stored [out, in] and
  transposed here; paths the module lacks are skipped: optional parts), `fixed` maps the other
  paths to their values (e.g. the draft vocabulary). Every path must get a value. A missing
  tensor or a wrong shape raises HeadLoadError naming it."""
  graphdef, abstract = nnx.split(nnx.eval_shape(make))
  flat = dict(nnx.to_flat_state(abstract))
  values = dict(fixed or {})
  for path, name in names.items():
    if path not in flat:
      continue
    if name not in tensors:
      raise HeadLoadError(f"{where} lacks tensor {name!r}")
    x = np.asarray(tensors[name])
    x = x.T if path[-1] == "kernel" else x
    want = tuple(flat[path].shape)
    if x.shape != want:
      raise HeadLoadError(f"{where}: {name} has shape {x.shape} (as jspec's [in, out]), "
                          f"expected {want} from the head's configuration")
    values[path] = jnp.asarray(x, dtype)
  return nnx.merge(graphdef, nnx.from_flat_state([(path, var.replace(values[path]))
                                                  for path, var in flat.items()]))


def read_d2t(tensors, wpath: str, draft_vocab_size: int, vocab_size: int) -> np.ndarray:
  """The target ids of a head's draft vocabulary from its `d2t` offsets (target = draft +
  d2t[draft]), checked: present, of the draft vocabulary's length, inside the target's vocabulary,
  strictly increasing; HeadLoadError otherwise."""
  if "d2t" not in tensors:
    raise HeadLoadError(f"{wpath} lacks tensor 'd2t' (the draft-to-target vocabulary offsets)")
  d2t = np.asarray(tensors["d2t"], np.int64)
  if d2t.shape != (draft_vocab_size,):
    raise HeadLoadError(f"{wpath}: d2t has shape {d2t.shape}, expected ({draft_vocab_size},)")
  ids = d2t + np.arange(draft_vocab_size)
  if ids.min() < 0 or ids.max() >= vocab_size or np.any(np.diff(ids) <= 0):
    raise HeadLoadError(f"{wpath}: d2t maps to target ids outside [0, {vocab_size}) or not "
                        "strictly increasing")
  return ids


def write_head_files(folder: str, tensors: dict, config: dict, draft_to_target,
                     vocab_size: int) -> dict:
  """Writes a head folder: model.safetensors (tensors plus the draft-vocabulary maps `d2t`, the
  offset of each draft id's target id, and `t2d`, the target ids in the vocabulary), config.json
  and checksums.json, each atomically. Returns {file: sha256}."""
  from safetensors.numpy import save

  ids = np.asarray(draft_to_target, np.int64)
  tensors = dict(tensors, d2t=ids - np.arange(len(ids), dtype=np.int64))
  t2d = np.zeros((vocab_size,), bool)
  t2d[ids] = True
  tensors["t2d"] = t2d
  atomic_write_bytes(os.path.join(folder, WEIGHTS), save(tensors))
  atomic_write_bytes(os.path.join(folder, CONFIG), (json.dumps(config, indent=2) + "\n").encode())
  sums = {f: sha256_of(os.path.join(folder, f)) for f in (CONFIG, WEIGHTS)}
  atomic_write_bytes(os.path.join(folder, CHECKSUMS), (json.dumps(sums, indent=2) + "\n").encode())
  return sums
