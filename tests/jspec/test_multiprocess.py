"""Two JAX processes on loopback (`python -m jspec.launch`, 4 host devices each) run one sharded
generate over the 8-device global mesh: greedy output equals one process on one device, plain on a
tiny dense model and a tiny MoE, speculative (n-gram) on the MoE; the CLI under the launcher
(n-gram on the default model) equals plain greedy decoding in one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = {"dense": {}, "moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24)}
CONFIGS = {"ngram": {"method": "ngram", "num_speculative_tokens": 3},
           "draft_model": {"method": "draft_model", "num_speculative_tokens": 2}}
# CI time: plain decoding on both models, speculative rounds (n-gram) on the MoE only; every
# drafter-model pairing, the serial draft model included, runs sharded on one process in
# tests/jspec/test_sharding.py
DRAFTERS = {"dense": (), "moe": ("ngram",)}


def _prompts():
  import numpy as np
  rng = np.random.default_rng(3)
  return [rng.integers(0, 8, n).tolist() for n in (9, 14, 5, 7)]


def _run(mesh=None) -> dict:
  from flax import nnx

  from jspec import Decoder, SpecDecoder
  from models import Llama, LlamaConfig
  out = {}
  for name, override in CASES.items():
    model = Llama(LlamaConfig.tiny(**override), rngs=nnx.Rngs(5))
    kw = dict(max_new_tokens=12, eos=False)
    out[f"{name}/plain"] = Decoder(model, mesh=mesh).generate(_prompts(), **kw).token_ids
    for label in DRAFTERS[name]:
      cfg = CONFIGS[label]
      draft = model if label == "draft_model" else None
      sd = SpecDecoder(model, cfg, draft_model=draft, mesh=mesh)
      out[f"{name}/{label}"] = sd.generate(_prompts(), **kw).token_ids
  return out


def _launch(command: list[str], processes: int, local_devices: int) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
  return subprocess.run([sys.executable, "-m", "jspec.launch", "--processes", str(processes),
                         "--local-devices", str(local_devices), "--"] + command,
                        env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_two_processes_equal_one_device():
  proc = _launch([sys.executable, os.path.abspath(__file__), "child"], 2, 4)
  assert proc.returncode == 0, proc.stderr[-4000:]
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  assert got.pop("processes") == 2 and got.pop("devices") == 8
  assert got == _run()


def test_a_failing_process_stops_the_others_and_the_status_says_so():
  proc = _launch([sys.executable, "-c", "import os, sys, time\n"
                  "if os.environ['JSPEC_PROCESS_ID'] == '1': sys.exit(3)\ntime.sleep(60)"], 2, 1)
  assert proc.returncode == 3


@pytest.mark.slow
def test_cli_under_the_launcher_equals_one_process(smollm):
  prompt = "Repeat this: the quick brown fox jumps over the lazy dog."
  args = ["generate", prompt, "--json", "--max-new-tokens", "16", "--drafter", "ngram",
          "--num-draft", "3"]
  two = _launch(["jspec"] + args + ["--mesh", "data=2,model=3"], 2, 3)
  assert two.returncode == 0, two.stderr[-3000:]
  got = json.loads(two.stdout.strip().splitlines()[-1])
  # one process, one device: what `jspec generate` decodes without --drafter (greedy)
  from jspec import Decoder
  tok = smollm.tokenizer
  ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": prompt}]))
  want = Decoder(smollm.model, eos_ids=tok.eos_ids).generate([ids], max_new_tokens=16)
  assert got["token_ids"] == want.token_ids[0] and got["same_as_baseline"]


if __name__ == "__main__":
  import jax

  from jspec import sharding
  assert sharding.initialize_from_env()
  result = _run(sharding.parse_mesh("data=2,model=2,expert=2"))
  if jax.process_index() == 0:
    print(json.dumps(dict(result, processes=jax.process_count(), devices=jax.device_count())))
