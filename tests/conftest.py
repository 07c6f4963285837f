"""Shared fixtures: the real default model (fetched once into the jspec cache) and torch oracles."""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import tempfile
import sys
import types

import jax
import pytest

jax.config.update("jax_default_matmul_precision", "highest")
# docs/examples holds code users copy (an example drafter registered from outside jspec); the tests
# import it as they would, once per process.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "docs", "examples"))


def _compilation_cache() -> None:
  """One persistent XLA compilation cache for the run, shared through the environment with the
  processes tests start (CLI runs, the multi-process launcher, notebook kernels): many tests
  compile the same programs (the default model's plain decoder at the same padding, tiny-model
  rounds), in other modules or processes, after the compiled programs were dropped (below). A
  fresh folder per run, removed at exit, unless JAX_COMPILATION_CACHE_DIR is set already."""
  if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    folder = tempfile.mkdtemp(prefix="jspec-test-xla-cache-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = folder
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
  jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
  jax.config.update("jax_persistent_cache_min_compile_time_secs",
                    float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))


_compilation_cache()


def _free_compiled() -> None:
  jax.clear_caches()
  gc.collect()


def _memory_maps() -> int:
  try:
    with open("/proc/self/maps", "rb") as f:
      return sum(1 for _ in f)
  except OSError:
    return 0


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
  """Every XLA:CPU executable keeps its own memory mappings; the whole suite compiles thousands
  (eager ops included) and ran past the kernel's map limit (vm.max_map_count, 65530), which
  crashed XLA's compiler with a segfault. Drop them after each test module..."""
  yield
  _free_compiled()


@pytest.fixture(autouse=True)
def _free_compiled_programs_when_many():
  """... and after any test that leaves the process with many mappings (a long module)."""
  yield
  if _memory_maps() > 20000:
    _free_compiled()


@pytest.fixture(scope="session")
def smollm():
  import models
  return models.load(models.DEFAULT_MODEL, quiet=True)


@pytest.fixture(scope="session")
def gguf_path(smollm):
  return smollm.source


@pytest.fixture(scope="session")
def hf_smollm(gguf_path):
  """HF transformers' own reading of the same GGUF, on torch CPU: the oracle."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  model = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=torch.float32)
  model.eval()
  return model


@pytest.fixture(scope="session")
def hf_tokenizer(gguf_path):
  transformers = pytest.importorskip("transformers")
  return transformers.AutoTokenizer.from_pretrained(
      os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))


CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain photosynthesis to a child in three sentences.",
    "List the first ten prime numbers.",
    "Translate 'the cat sleeps' into German.",
]


@pytest.fixture(scope="session")
def chat_ids(smollm):
  tok = smollm.tokenizer
  return [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in CHAT_PROMPTS]


class CharTokenizer:
  """Characters to ids below a tiny vocabulary: enough for CLI and harness tests."""
  eos_ids = (0,)

  def __init__(self, vocab_size: int):
    self.vocab_size = vocab_size

  def apply_chat_template(self, messages):
    return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

  def encode(self, text):
    return [1 + ord(ch) % (self.vocab_size - 1) for ch in text]

  def decode(self, ids, skip_special_tokens=True):
    return "".join(chr(97 + i % 26) for i in ids)


@pytest.fixture(scope="session")
def tiny_loaded_factory():
  """seed -> a LoadedModel-like namespace around a tiny random Llama and a CharTokenizer."""
  from flax import nnx

  from models import Llama, LlamaConfig

  def make(seed: int):
    cfg = LlamaConfig.tiny()
    return types.SimpleNamespace(model=Llama(cfg, rngs=nnx.Rngs(seed)),
                                 tokenizer=CharTokenizer(cfg.vocab_size), name="tiny-random")
  return make


# The longest test modules, longest first, with their seconds in a local run of the suite (2 cores,
# -n 2 --dist loadfile, --durations=0; 5140 s of tests in 2626 s). xdist hands whole modules to the
# workers in the order below, then the rest in collection order: longest-first keeps the two
# workers finishing together. (By default xdist orders modules by their number of tests, which
# left the notebooks, the sharding and the launcher tests, few tests but minutes each, to run last
# on one worker while the other idled: one local run took 2767 s of wall time for ~3800 s of CPU
# time, CI 2791 s.) Update the list when a module's time changes much.
RUN_FIRST = [
    "tests/jspec/test_greedy_identity.py",       # ~870 s
    "tests/jspec/test_lossless_montecarlo.py",   # ~530 s
    "tests/jspec/test_adaptive.py",              # ~460 s
    "tests/notebooks/test_notebooks.py",         # ~450 s
    "tests/jspec/test_multiprocess.py",          # ~265 s, both cores
    "tests/jspec/test_sharding.py",              # ~210 s, both cores
    "tests/jspec/bench/test_bench_harness.py",   # ~175 s
    "tests/jspec/train/test_eagle3_train.py",    # ~170 s
    "tests/jspec/test_plan.py",                  # ~150 s
    "tests/jspec/test_mtp.py",                   # ~125 s
    "tests/jspec/test_engine.py",                # ~115 s
]


def pytest_configure(config):
  if hasattr(config.option, "loadscopereorder"):
    config.option.loadscopereorder = False     # keep the order below (xdist's controller reads it)


def pytest_collection_modifyitems(items):
  rank = {path: i for i, path in enumerate(RUN_FIRST)}
  items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(RUN_FIRST)))
