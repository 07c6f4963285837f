"""The drafter registry: a method registered in its own file reaches SpeculativeConfig,
SpecDecoder, `jspec generate --drafter` and `jspec bench --drafters` with nothing else touched;
bad method keys get clear errors; the train CLI rejects bad input before loading a model."""

import dataclasses

import numpy as np
import pytest
from flax import nnx

from jspec import SpecDecoder, SpeculativeConfig, cli, cli_args
from jspec.drafters import registry
from jspec.drafters.model_free.ngram import NgramDrafter
from models import Llama, LlamaConfig


def test_builtin_methods_are_registered():
  assert set(registry.methods()) >= {"ngram", "draft_model", "layer_skip", "eagle3"}
  assert registry.get("layer-skip") is registry.get("layer_skip")
  with pytest.raises(ValueError, match=r"unknown speculative method 'medusa9'; choose one of"):
    registry.get("medusa9")


@dataclasses.dataclass(frozen=True)
class _EveryOtherOptions:
  stride: int = 2


def test_a_new_method_needs_only_its_registration(monkeypatch):
  """A toy method (n-gram with another default) registered from outside jspec works end to end."""
  built = []

  def build(opts, d, target, draft_model=None):
    built.append(opts.stride)
    return NgramDrafter(d, 1, opts.stride), None

  entry = registry.Method("toy_lookup", _EveryOtherOptions, build,
                          cli_flags=(registry.CliFlag("--toy-stride", "stride", int),))
  monkeypatch.setitem(registry._METHODS, "toy_lookup", entry)
  cfg = SpeculativeConfig.from_dict({"method": "toy-lookup", "num_speculative_tokens": 2,
                                     "stride": 3})
  assert cfg.method == "toy_lookup" and cfg.options.stride == 3
  assert cfg.to_dict() == {"method": "toy_lookup", "num_speculative_tokens": 2, "stride": 3}
  with pytest.raises(ValueError, match=r"unknown speculative config keys \['width'\] for method "
                                       r"'toy_lookup'"):
    SpeculativeConfig.from_dict({"method": "toy_lookup", "num_speculative_tokens": 2, "width": 1})
  model = Llama(LlamaConfig.tiny(), rngs=nnx.Rngs(0))
  out = SpecDecoder(model, cfg).generate([[1, 2, 3, 1, 2]], max_new_tokens=5, eos=False)
  assert built == [3] and len(out.token_ids[0]) == 5
  # the CLI sees the method and its flag
  parsed = []
  monkeypatch.setattr(cli, "cmd_generate", lambda args: parsed.append(args))
  cli.main(["generate", "hi", "--drafter", "toy-lookup", "--toy-stride", "4"])
  assert cli_args.spec_config(parsed[0].drafter, 2, parsed[0]).options.stride == 4


@pytest.mark.parametrize("cfg, message", [
    ({"method": "eagle3", "num_speculative_tokens": 2, "prompt_lookup_min": 1},
     r"unknown speculative config keys \['prompt_lookup_min'\] for method 'eagle3'"),
    ({"method": "layer_skip", "num_speculative_tokens": 2, "num_layers": 0},
     "num_layers must be an integer >= 1"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2.5},
     "needs integers"),
    ({"method": "eagle3", "num_speculative_tokens": 4, "tree_top_k": 2},
     "EAGLE-2 trees need both tree_top_k >= 1 and tree_depth >= 1"),
    ({"method": "mtp", "num_speculative_tokens": 4, "tree_depth": -1},
     "EAGLE-2 trees need both tree_top_k >= 1 and tree_depth >= 1"),
])
def test_method_options_are_validated(cfg, message):
  with pytest.raises(ValueError, match=message):
    SpeculativeConfig.from_dict(cfg)


def test_eagle3_without_a_head_says_how_to_get_one():
  model = Llama(LlamaConfig.tiny(), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"no EAGLE-3 head is shipped for this target.*jspec train"):
    SpecDecoder(model, {"method": "eagle3", "num_speculative_tokens": 2})


@pytest.mark.parametrize("method, argv, message", [
    ("eagle3", ["--steps", "0"], "steps must be an integer >= 1"),
    ("eagle3", ["--warmup", "5000"], "warmup must be in [0, steps=2000]"),
    ("eagle3", ["--ttt-steps", "0"], "--ttt-steps must be >= 1"),
    ("eagle3", ["--data", "/nonexistent/data"], "has no manifest.json"),
    ("medusa", ["--num-heads", "0"], "--num-heads must be >= 1"),
    ("medusa", ["--data", "/nonexistent/data"], "has no manifest.json"),
    ("mtp", ["--mtp-steps", "0"], "--mtp-steps must be >= 1"),
    ("mtp", ["--beta", "1.5"], "--beta must be in (0, 1]"),
])
def test_train_cli_rejects_bad_input_before_loading(method, argv, message, tmp_path, monkeypatch):
  import models
  monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("loaded a model"))
  base = ["train", method, "--data", str(tmp_path), "--out", str(tmp_path / "out")]
  with pytest.raises(SystemExit) as e:
    cli.main(base + argv)
  assert message in str(e.value)


def test_draft_token_greedy_and_sampled_agree_with_process_logits():
  """The shared draft sampler: greedy rows take the argmax with one-hot q; sampled rows record
  exactly the processed distribution."""
  import jax
  import jax.numpy as jnp

  from jspec.drafters.base import draft_token
  from jspec.sampling import SamplingParams, process_logits
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(3, 7)), jnp.float32)
  sampling = SamplingParams.make(3, [0.0, 1.0, 0.5], [0, 3, 0], [1.0, 1.0, 0.8])
  keys = jax.random.split(jax.random.key(1), 3)
  tok, q = draft_token(logits, sampling, keys, 0, True)
  np.testing.assert_allclose(q, np.exp(process_logits(logits, sampling)), atol=1e-6)
  assert int(tok[0]) == int(jnp.argmax(logits[0])) and all(q[r, tok[r]] > 0 for r in range(3))
  tok, q = draft_token(logits, sampling, keys, 0, False)
  assert q is None and tok.tolist() == jnp.argmax(logits, -1).tolist()
