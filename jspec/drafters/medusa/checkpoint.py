"""Medusa heads on disk (config.json + model.safetensors + checksums.json, in the layout of
FasterDecoding/Medusa's checkpoints).

Weights use torch's [out, in] layout and Medusa's names: `medusa_head.{k}.{l}.linear.weight` /
`.bias` for ResBlock l of head k and `medusa_head.{k}.{L}.weight` [Vd, H] for its LM head; the
draft vocabulary as in the EAGLE-3 format (`d2t` int64 offsets, target = draft + d2t[draft]; `t2d`
bool [V]). Heads that draft with the target's LM-head rows (config `"jspec_lm_head": "target"`, a
jspec extension) store no LM-head tensors; the rows are taken from the target when the drafter is
built. `checksums.json` (sha256 per file) is verified on load when present.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jspec.drafters.heads import (CONFIG, WEIGHTS, HeadLoadError, read_d2t, read_weights,
                                  write_head_files)
from jspec.drafters.medusa.module import MedusaConfig, MedusaHead
from jspec.drafters.shared import LM_HEADS

LM_HEAD_KEY = "jspec_lm_head"   # "target": the heads draft with the target's LM-head rows (unsaved)


def _names(cfg: MedusaConfig):
  """(k, l, weight name, bias name) per ResBlock, then (k, LM-head name) per head."""
  blocks = [(k, l, f"medusa_head.{k}.{l}.linear.weight", f"medusa_head.{k}.{l}.linear.bias")
            for k in range(cfg.num_heads) for l in range(cfg.num_layers)]
  heads = [(k, f"medusa_head.{k}.{cfg.num_layers}.weight") for k in range(cfg.num_heads)]
  return blocks, heads if cfg.lm_head == "own" else []


def _config_dict(cfg: MedusaConfig, verifier: str) -> dict:
  return {
      "architectures": ["MedusaModel"],
      "model_type": "medusa",
      "medusa_num_heads": cfg.num_heads,
      "medusa_num_layers": cfg.num_layers,
      "hidden_size": cfg.hidden_size,
      "vocab_size": cfg.vocab_size,
      "draft_vocab_size": cfg.draft_vocab_size,
      "base_model_name_or_path": verifier,
      "jspec_format": "medusa/1",
      **({LM_HEAD_KEY: cfg.lm_head} if cfg.lm_head != "own" else {}),
  }


def save_medusa(head: MedusaHead, folder: str, *, dtype=jnp.bfloat16,
                verifier: str = "") -> dict[str, str]:
  """Writes config.json, model.safetensors (weights cast to `dtype`) and checksums.json; each file
  atomically. Returns {file: sha256}."""

  from jspec.io import check_writable

  os.makedirs(folder, exist_ok=True)
  check_writable(os.path.join(folder, WEIGHTS))
  cfg = head.config
  cast = lambda x: np.asarray(jnp.asarray(x).astype(dtype))   # ml_dtypes numpy type for bf16
  w, b = head.res_kernel[...], head.res_bias[...]
  blocks, heads = _names(cfg)
  tensors = {}
  for k, l, wname, bname in blocks:
    tensors[wname] = cast(w[k, l].T)                              # [out, in]
    tensors[bname] = cast(b[k, l])
  for k, name in heads:
    tensors[name] = cast(head.lm_head[...][k].T)                  # [Vd, H]
  return write_head_files(folder, tensors, _config_dict(cfg, verifier), head.draft_to_target[...],
                          cfg.vocab_size)


def read_config(folder: str) -> MedusaConfig:
  path = os.path.join(folder, CONFIG)
  if not os.path.isdir(folder):
    raise HeadLoadError(f"Medusa head folder {folder!r} does not exist")
  if not os.path.isfile(path):
    raise HeadLoadError(f"{path} is missing: a Medusa head folder holds {CONFIG} and {WEIGHTS}")
  try:
    with open(path) as f:
      raw = json.load(f)
    if "medusa_num_heads" not in raw:
      raise HeadLoadError(f"{path} has no medusa_num_heads: not a Medusa head config")
    lm_head = raw.get(LM_HEAD_KEY, "own")
    if lm_head not in LM_HEADS:
      raise HeadLoadError(f"{path}: {LM_HEAD_KEY} is {lm_head!r}; jspec reads {LM_HEADS}")
    return MedusaConfig(hidden_size=raw["hidden_size"], vocab_size=raw["vocab_size"],
                        draft_vocab_size=raw.get("draft_vocab_size", raw["vocab_size"]),
                        num_heads=raw["medusa_num_heads"],
                        num_layers=raw.get("medusa_num_layers", 1), lm_head=lm_head)
  except HeadLoadError:
    raise
  except (KeyError, TypeError, ValueError) as e:
    raise HeadLoadError(f"{path} is not a valid Medusa config: {e!r}") from None


RANK_ACCURACY = "rank_accuracy.json"


def save_rank_accuracy(folder: str, accuracy, *, source: str = "") -> None:
  """Saves measured rank accuracies [heads, ranks] (`jspec.train.medusa.rank_accuracy`) beside a
  head, for `tree_choices="auto"`."""
  from jspec.io import atomic_write_bytes

  body = {"rank_accuracy": [[float(x) for x in row] for row in accuracy], "source": source}
  atomic_write_bytes(os.path.join(folder, RANK_ACCURACY),
                     (json.dumps(body, indent=2) + "\n").encode())


def read_rank_accuracy(folder: str) -> list[list[float]]:
  path = os.path.join(folder, RANK_ACCURACY)
  if not os.path.isfile(path):
    raise HeadLoadError(f"{path} is missing: tree_choices='auto' needs the head's measured rank "
                        "accuracies (jspec.train.medusa.rank_accuracy, saved with "
                        "medusa_format.save_rank_accuracy), or give explicit tree_choices")
  with open(path) as f:
    return json.load(f)["rank_accuracy"]


def load_medusa(folder: str, *, dtype=jnp.float32,
                expected_sha256: str | None = None) -> MedusaHead:
  """Reads a Medusa head folder; every check happens before any compilation. Heads with
  `lm_head="target"` draft only once their rows are attached (`attach_target_rows`, done by
  MedusaDrafter.from_head)."""
  cfg = read_config(folder)
  wpath, tensors = read_weights(folder, "a Medusa head folder", expected_sha256)

  def get(name, shape):
    if name not in tensors:
      raise HeadLoadError(f"{wpath} lacks tensor {name!r}")
    x = np.asarray(tensors[name])
    if x.shape != shape:
      raise HeadLoadError(f"{wpath}: {name} has shape {x.shape}, expected {shape} from {CONFIG}")
    return x.astype(np.float32)

  h, vd = cfg.hidden_size, cfg.draft_vocab_size
  w = np.zeros((cfg.num_heads, cfg.num_layers, h, h), np.float32)
  b = np.zeros((cfg.num_heads, cfg.num_layers, h), np.float32)
  lm = np.zeros((cfg.num_heads, h, vd) if cfg.lm_head == "own" else (0,), np.float32)
  blocks, heads = _names(cfg)
  for k, l, wname, bname in blocks:
    w[k, l] = get(wname, (h, h)).T
    b[k, l] = get(bname, (h,))
  for k, name in heads:
    lm[k] = get(name, (vd, h)).T
  ids = read_d2t(tensors, wpath, vd, cfg.vocab_size)
  values = {("res_kernel",): jnp.asarray(w, dtype), ("res_bias",): jnp.asarray(b, dtype),
            ("draft_to_target",): jnp.asarray(ids, jnp.int32)}
  if cfg.lm_head == "own":
    values[("lm_head",)] = jnp.asarray(lm, dtype)
  else:                         # filled from the target by attach_target_rows
    values[("lm_head", "rows")] = jnp.zeros((vd, h), dtype)
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: MedusaHead(cfg, dtype=dtype)))
  filled = [(path, var.replace(values[path])) for path, var in nnx.to_flat_state(abstract)]
  return nnx.merge(graphdef, nnx.from_flat_state(filled))
