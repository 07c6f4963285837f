"""The default model's GGUF read as stored (`--weights gguf`: Q4_1 layers, a Q8_0 embedding and
tied head) against the same file dequantised to float32: every weight, greedy output over 20 suite
prompts, and no recompilation; the loader's choices and refusals."""

import json
import os

import numpy as np
import pytest
from flax import nnx

import models
from jspec.decode import Decoder
from jspec.prompt_suite import load as load_suite
from models.stored_layers import StoredEmbed, StoredLinear, weight_bytes
from models.weight_formats import dequantize

pytestmark = pytest.mark.slow
SUITE = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "prompts", "suite.jsonl")


@pytest.fixture(scope="module")
def stored():
  return models.load(models.DEFAULT_MODEL, quiet=True, weights="gguf")


def test_every_stored_weight_dequantises_to_the_float_model(stored, smollm):
  """The file's blocks, split, row-permuted (Q/K) and mapped to layers, hold exactly the weights
  the float32 load dequantised: equal bit for bit."""
  floats = dict(nnx.iter_modules(smollm.model))
  seen = {}
  for path, module in nnx.iter_modules(stored.model):
    for name, child in vars(module).items():
      if isinstance(child, (StoredLinear, StoredEmbed)):
        seen[child.fmt] = seen.get(child.fmt, 0) + 1
        ref = getattr(floats[path], name)
        want = ref.embedding[...] if isinstance(child, StoredEmbed) else ref.kernel[...].T
        np.testing.assert_array_equal(np.asarray(dequantize(child.tensor())), np.asarray(want))
  assert seen == {"q4_1": 7 * 30, "q8_0": 1}
  assert weight_bytes(stored.model) < 0.2 * weight_bytes(smollm.model)


def test_greedy_identical_to_float_up_to_near_ties(stored, smollm):
  """20 suite prompts (every category), 24 greedy tokens, batches of 10: the stored path emits
  the float path's tokens up to the first step whose float top-2 gap is below 1e-3 (summation
  order differs between the kernels), and no prompt diverges before such a tie."""
  tok = smollm.tokenizer
  prompts = load_suite(SUITE)
  by_cat = {}
  for p in prompts:
    by_cat.setdefault(p.category, []).append(p)
  chosen = [p for i in range(3) for ps in by_cat.values() for p in ps[i:i + 1]][:20]
  assert len(chosen) == 20
  ids = [tok.encode(tok.apply_chat_template(list(p.messages)))[-384:] for p in chosen]
  runs = {}
  for key, lm in (("f32", smollm.model), ("gguf", stored.model)):
    dec = Decoder(lm, eos_ids=tok.eos_ids)
    runs[key] = [dec.generate(ids[i:i + 10], max_new_tokens=24, eos=False) for i in (0, 10)]
  same = 0
  for a, b in zip(runs["f32"], runs["gguf"]):
    for want, got, gaps in zip(a.token_ids, b.token_ids, a.margins):
      first = next((i for i, (x, y) in enumerate(zip(want, got)) if x != y), None)
      if first is None:
        same += 1
      else:
        assert min(gaps[:first + 1]) < 1e-3, (first, gaps[:first + 1])
  assert same >= 18


def test_no_recompile_across_prompts(stored):
  from jspec.compile_count import count_compiles
  tok = stored.tokenizer
  dec = Decoder(stored.model, eos_ids=tok.eos_ids)
  prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}]))
             for t in ("Name a colour.", "What is two plus two? Answer briefly.")]
  dec.generate(prompts[:1], max_new_tokens=8)
  with count_compiles() as c:
    dec.generate(prompts[1:], max_new_tokens=8)
  assert c.count == 0


def test_loader_choices_and_refusals(tmp_path, gguf_path):
  with pytest.raises(models.ModelLoadError, match="weights must be one of"):
    models.load(gguf_path, weights="q4_k")
  folder = tmp_path / "hf"
  folder.mkdir()
  (folder / "config.json").write_text(json.dumps({}))
  with pytest.raises(models.ModelLoadError, match="--weights gguf keeps a GGUF file's blocks"):
    models.load(str(folder), weights="gguf")
  lm = models.load(gguf_path, weights="int8").model
  assert lm.layers[0].mlp.up_proj.fmt == "int8" and lm.embed.fmt == "int8"


@pytest.mark.parametrize("cfg", [
    {"method": "eagle3", "num_speculative_tokens": 5},
    {"method": "layer_skip", "num_speculative_tokens": 1, "num_layers": 8},
    {"method": "dflash", "num_speculative_tokens": 7},
], ids=["eagle3", "layer_skip", "dflash"])
def test_speculation_on_a_stored_target_is_greedy_identical(stored, cfg):
  """Drafters that read the target's embedding and head rows (EAGLE-3, DFlash) or run its own
  layers (layer-skip) on the stored target: the plain stored path's tokens, up to near-ties."""
  from jspec import SpecDecoder
  tok = stored.tokenizer
  prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}])) for t in (
      "Repeat this sentence twice: the quick brown fox jumps over the lazy dog.",
      "Count from one to ten in words.", "Name the planets of the solar system.",
      "Write one sentence about rain.")]
  plain = Decoder(stored.model).generate(prompts, max_new_tokens=12, eos=False)
  spec = SpecDecoder(stored.model, cfg, time_rounds=False).generate(prompts, max_new_tokens=12,
                                                                    eos=False)
  for want, got, gaps in zip(plain.token_ids, spec.token_ids, plain.margins):
    upto = next((j for j, g in enumerate(gaps) if g < 1e-4), len(want))
    assert got[:upto] == want[:upto]
