"""Sharded decoding on 8 host devices (a subprocess: the device count is fixed before jax starts).

Greedy generation on a mesh, plain and speculative (two drafters), equals the single-device run
token for token (up to a near-tie of the single-device run, where either token is right); weights
stay sharded (no all-gather yields a weight's shape); zero recompiles after warm-up; for a tiny
dense model, a tiny MoE (experts over the "expert" axis, through the expert-parallel layer) and the
default model (9 heads over model=3). Also the mesh spec's errors and the weight placement rules.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import jax
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NEAR_TIE = 1e-4


def _same_up_to_near_tie(got, ref, margins) -> bool:
  for row, ref_row, m in zip(got, ref, margins):
    ties = [j for j, x in enumerate(m) if x < NEAR_TIE]
    upto = ties[0] if ties else len(ref_row)
    if row[:upto] != ref_row[:upto]:
      return False
  return True


def _gathered_weights(decoder) -> list[str]:
  """Shapes of sharded weights that some all-gather in the compiled programs produces."""
  sharded = {tuple(w.shape) for w in jax.tree.leaves(decoder.weights)
             if not w.sharding.is_fully_replicated}
  found = []
  for programs in decoder._programs.values():
    for prog in programs:
      for dtype, dims in re.findall(r"= (\w+)\[([\d,]*)\]\S* all-gather\(", prog.as_text()):
        shape = tuple(int(d) for d in dims.split(",") if d)
        if shape in sharded:
          found.append(f"{dtype}{list(shape)}")
  return found


def _child(which: str) -> dict:
  import numpy as np
  from flax import nnx

  from jspec import Decoder, SpecDecoder, count_compiles, sharding
  from models import Llama, LlamaConfig

  res = {"devices": jax.device_count(), "runs": {}}
  if which == "tiny":
    cases = {"dense": LlamaConfig.tiny(),
             "moe": LlamaConfig.tiny(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24)}
    mesh_spec = "data=2,model=2,expert=2"
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 8, n).tolist() for n in (9, 14, 5, 7)]
    new = 12
    models = {name: Llama(cfg, rngs=nnx.Rngs(5)) for name, cfg in cases.items()}
    # the draft model is the target itself (self-draft, replicated): its drafts get accepted
    drafters = {"ngram": ({"method": "ngram", "num_speculative_tokens": 3}, None),
                "draft_model": ({"method": "draft_model", "num_speculative_tokens": 2}, "self")}
  else:
    import models as registry
    from jspec.drafters import heads
    smollm = registry.load()
    tok = smollm.tokenizer
    texts = ["Repeat this sentence twice: the quick brown fox jumps over the lazy dog.",
             "Name the planets of the solar system."]
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}]))
               for t in texts]
    mesh_spec, new = "data=2,model=3", 12
    models = {"default": smollm.model}
    assert heads.shipped("eagle3", smollm.model.config) is not None
    drafters = {"ngram": ({"method": "ngram", "num_speculative_tokens": 3}, None),
                "eagle3": ({"method": "eagle3", "num_speculative_tokens": 3}, None)}
  mesh = sharding.parse_mesh(mesh_spec)
  for name, model in models.items():
    ref = Decoder(model).generate(prompts, max_new_tokens=new, eos=False)
    run = {}
    dec = Decoder(model, mesh=mesh)
    run["placement"] = sharding.describe(dec.weights, model.config, mesh)
    run["plain"] = _same_up_to_near_tie(dec.generate(prompts, max_new_tokens=new,
                                                     eos=False).token_ids,
                                        ref.token_ids, ref.margins)
    run["plain_gathers"] = _gathered_weights(dec)
    for label, (cfg, draft_model) in drafters.items():
      sd = SpecDecoder(model, cfg, draft_model=model if draft_model == "self" else draft_model,
                       mesh=mesh)
      out = sd.generate(prompts, max_new_tokens=new, eos=False)
      run[label] = _same_up_to_near_tie(out.token_ids, ref.token_ids, ref.margins)
      run[f"{label}_accepted"] = out.accepted
      with count_compiles() as c:   # other prompts of the same bucket: no new program
        sd.generate([p[::-1] for p in prompts], max_new_tokens=new, eos=False)
      run[f"{label}_recompiles"] = c.count
      run[f"{label}_gathers"] = _gathered_weights(sd)
    res["runs"][name] = run
  return res


def _run_child(which: str) -> dict:
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), which], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _check(res: dict, drafters: tuple[str, ...]) -> None:
  assert res["devices"] == 8
  for name, run in res["runs"].items():
    assert run["plain"], f"{name}: sharded plain decoding differs"
    assert run["plain_gathers"] == [], f"{name}: weights gathered {run['plain_gathers']}"
    for label in drafters:
      assert run[label], f"{name}/{label}: sharded speculative decoding differs"
      assert run[f"{label}_accepted"] > 0, f"{name}/{label}: nothing accepted, nothing tested"
      assert run[f"{label}_recompiles"] == 0
      assert run[f"{label}_gathers"] == [], f"{name}/{label}: weights gathered"


def test_sharded_tiny_dense_and_moe_equal_one_device():
  res = _run_child("tiny")
  _check(res, ("ngram", "draft_model"))
  dense, moe = res["runs"]["dense"]["placement"], res["runs"]["moe"]["placement"]
  assert dense["layers.0.attn.q_proj.kernel"] == "P(None, 'model')"
  assert dense["layers.0.attn.o_proj.kernel"] == "P('model', None)"
  assert dense["layers.0.mlp.down_proj.kernel"] == "P('model', None)"
  assert dense["lm_head.kernel"] == "P(None, 'model')"
  assert moe["layers.0.mlp.w_gate"] == "P('expert', None, None)"
  assert moe["layers.0.mlp.router"] == "P()"


@pytest.mark.slow
def test_sharded_default_model_equals_one_device():
  res = _run_child("default")
  _check(res, ("ngram", "eagle3"))
  placement = res["runs"]["default"]["placement"]
  assert placement["layers.0.attn.k_proj.kernel"] == "P(None, 'model')"    # 3 KV heads / 3


def test_mesh_spec_errors_and_placement_rules():
  from jspec import sharding
  from models import LlamaConfig
  for spec, match in (("data2", "axis=size pairs"), ("data=x", "axis=size pairs"),
                      ("pipe=2", "not known"), ("data=0", ">= 1"),
                      ("data=64", "needs 64 devices")):
    with pytest.raises(ValueError, match=match):
      sharding.parse_mesh(spec)
  mesh = sharding.parse_mesh("data=1")
  assert dict(zip(mesh.axis_names, mesh.axis_sizes)) == {"data": 1, "model": 1, "expert": 1}

  class FakeMesh:   # the rules only read the axis sizes
    axis_names, axis_sizes, empty = ("data", "model", "expert"), (1, 4, 1), False
  cfg = LlamaConfig.smollm2_135m()    # 9 heads, 3 KV heads: no split over 4; MLP 1536 splits
  spec = lambda path, shape: str(sharding.weight_spec(path, shape, cfg, FakeMesh()))
  assert spec(("layers", 0, "attn", "q_proj", "kernel"), (576, 576)) == "P()"
  assert spec(("layers", 0, "mlp", "gate_proj", "kernel"), (576, 1536)) == \
      "P(None, 'model')"
  assert spec(("embed", "embedding"), (49152, 576)) == "P()"


if __name__ == "__main__":
  print(json.dumps(_child(sys.argv[1])))
