"""Greedy speculative decoding emits plain greedy decoding's tokens on the default model: 20 prompts
x B = 4 x every drafter (and the 4 copy-heavy prompts one at a time for n-gram, EAGLE-3 and
DSpark D = 4): n-gram D = 7, the draft model and layer-skip D = 1, EAGLE-3 D = 5,
the model-free suffix, lookahead and prediction drafters D = 3; EAGLE-3 also with the adaptive
"auto" (every length and plain rounds; n-gram's adaptive rounds are in the tiny-model tests and
every benchmark run); EAGLE-2 trees of 10 nodes on the EAGLE-3 head; the best static Medusa tree of
8 nodes; EAGLE-2 trees of 6 nodes on the MTP module; DFlash blocks of 8 (D = 7); DSpark blocks of 4
(D = 4) and of 8 with confidence-scheduled prefixes; the n-gram / EAGLE-3 hybrid over 3-node trees.
(Chains of other lengths are in the tiny-model tests, the exact enumeration and the Monte-Carlo
test; the CI budget bounds this file.)

A (1+D)-token verify and a 1-token decode reduce in different orders, so where the plain path's
own top-2 logit gap is below 1e-4 either token is correct: rows are compared up to the first such
near-tie, and the near-tie rate is reported. Any divergence without a near-tie fails.
"""

import numpy as np
import pytest

from jspec import Decoder, SpecDecoder
from jspec.drafters import heads

pytestmark = pytest.mark.slow

NEW = 12
NEAR_TIE = 1e-4
PROMPTS = [
    "Repeat this sentence twice: the quick brown fox jumps over the lazy dog.",
    "Copy this list exactly: apples, pears, plums, figs, dates.",
    "Rename the variable x to total in: x = 0; for v in vals: x += v",
    "Fix the typo and repeat: The cat sat on teh mat.",
    "Say 'hello world' three times.",
    "Count from one to ten in words.",
    "What is 12 times 12?",
    "Name the planets of the solar system.",
    "Write one sentence about rain.",
    "What does CPU stand for?",
    "Give a synonym for happy.",
    "What is the capital of Italy?",
    "Spell the word banana letter by letter.",
    "Finish the phrase: to be or not to be",
    "Convert 3 meters to centimeters.",
    "List three colors of the rainbow.",
    "Translate 'thank you' into French.",
    "What is the boiling point of water?",
    "Write a Python print statement for hi.",
    "Name a famous painter.",
]
DRAFTERS = {
    "ngram": lambda d: ({"method": "ngram", "num_speculative_tokens": d}, False),
    "draft_model": lambda d: ({"method": "draft_model", "num_speculative_tokens": d}, True),
    "layer_skip": lambda d: ({"method": "layer_skip", "num_speculative_tokens": d,
                              "num_layers": 8}, False),
    "eagle3": lambda d: ({"method": "eagle3", "num_speculative_tokens": d}, False),
    "suffix": lambda d: ({"method": "suffix", "num_speculative_tokens": d}, False),
    "lookahead": lambda d: ({"method": "lookahead", "num_speculative_tokens": d}, False),
    "prediction": lambda d: ({"method": "prediction", "num_speculative_tokens": d}, False),
    # adaptive draft length: every round verifies one of 0, 1, 2, 3, 5, 7 drafts
    "eagle3_auto": lambda d: ({"method": "eagle3", "num_speculative_tokens": d}, False),
    # EAGLE-2 dynamic trees of d nodes (top-3 children, depth 4)
    "eagle3_tree": lambda d: ({"method": "eagle3", "num_speculative_tokens": d, "tree_top_k": 3,
                               "tree_depth": 4}, False),
    # the best static tree of d nodes for the shipped Medusa head's measured rank accuracies
    "medusa_tree": lambda d: ({"method": "medusa", "num_speculative_tokens": d,
                               "tree_choices": "auto"}, False),
    # EAGLE-2 trees on the shipped MTP module (top-2 children, depth 3)
    "mtp_tree": lambda d: ({"method": "mtp", "num_speculative_tokens": d, "tree_top_k": 2,
                            "tree_depth": 3}, False),
    # the shipped DFlash / DSpark heads (block drafters; DSpark samples nothing at T = 0)
    "dflash": lambda d: ({"method": "dflash", "num_speculative_tokens": d}, False),
    "dspark": lambda d: ({"method": "dspark", "num_speculative_tokens": d}, False),
    "dspark_schedule": lambda d: ({"method": "dspark", "num_speculative_tokens": d,
                                   "confidence_schedule": True}, False),
    # n-gram lookup where a 2-gram repeats (its chain as a tree), the shipped EAGLE-3 head's
    # EAGLE-2 trees elsewhere (top-3 children, depth 3; the chain hybrid: tiny-model tests)
    "hybrid": lambda d: ({"method": "hybrid", "num_speculative_tokens": d, "tree_top_k": 3,
                          "tree_depth": 3}, False),
}
DEPTHS = {"ngram": (7,), "draft_model": (1,), "layer_skip": (1,), "eagle3": (5,), "suffix": (3,),
          "lookahead": (3,), "prediction": (3,), "eagle3_auto": ("auto",),
          "eagle3_tree": (10,), "medusa_tree": (8,), "mtp_tree": (6,), "dflash": (7,),
          "dspark": (4,), "dspark_schedule": (8,), "hybrid": (3,)}
# B = 4 for every case; B = 1 as well for n-gram, EAGLE-3 and DSpark D = 4 (one model-free chain,
# one serial head, one block head): each B = 4 row is decoded independently, so B = 1 adds little
# for the rest ("auto" and DFlash at B = 1 were dropped for CI time, 230 s: their B = 1 programs
# differ from the B = 4 ones only in the batch dimension; DSpark's confidence schedule verifies the
# widest live row's prefix: at B = 1, the row's own, a special case)
BOTH = {"ngram", "eagle3", "dspark"}
B1_PROMPTS = 4     # the copy-heavy prompts, where rounds accept the most (CI time)
CASES = [(name, d, b) for name in DRAFTERS for d in DEPTHS[name]
         for b in ((1, 4) if name in BOTH else (4,))]
_stats = {"rows": 0, "near_ties": 0}


@pytest.fixture(scope="module")
def prompts(smollm):
  tok = smollm.tokenizer
  ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS]
  assert all(32 < len(i) <= 64 for i in ids)    # one prompt bucket: one compile per config
  return ids


@pytest.fixture(scope="module")
def plain(smollm, prompts):
  decoder = Decoder(smollm.model)
  outs = [decoder.generate([p], max_new_tokens=NEW, eos=False) for p in prompts]
  return [(o.token_ids[0], o.margins[0]) for o in outs]


@pytest.fixture(scope="module")
def eagle3_head(smollm):
  """The shipped head; where none is shipped, an untrained one (identity holds for any head)."""
  if heads.shipped("eagle3", smollm.model.config) is not None:
    return None
  from jspec.train.eagle3 import init_head
  return init_head(smollm.model, np.arange(0, smollm.model.config.vocab_size, 6), seed=0)


@pytest.mark.parametrize("name, d, batch", CASES)
def test_greedy_identity(smollm, prompts, plain, eagle3_head, name, d, batch):
  cfg, self_draft = DRAFTERS[name](d)
  draft = smollm.model if self_draft else (
      eagle3_head if name.startswith("eagle3") or name == "hybrid" else None)
  # "auto" without timing its rounds at compile (the timing changes no token: test_adaptive)
  sd = SpecDecoder(smollm.model, cfg, draft_model=draft, time_rounds=False)
  # predictions: the plain output with a gap and a wrong token (re-synchronisation), none for
  # every third row (n-gram fallback); suffix keeps its global cache across the calls
  preds = [None if i % 3 == 0 else ref[:4] + ref[7:10] + [ref[10] + 1] + ref[11:]
           for i, (ref, _) in enumerate(plain)]
  outs = []
  for start in range(0, len(prompts) if batch > 1 else B1_PROMPTS, batch):
    extra = dict(prediction=preds[start:start + batch]) if name == "prediction" else {}
    outs += sd.generate(prompts[start:start + batch], max_new_tokens=NEW, eos=False,
                        **extra).token_ids
  assert len(outs) == (len(prompts) if batch > 1 else B1_PROMPTS)
  for i, (spec, (ref, margins)) in enumerate(zip(outs, plain)):
    assert len(spec) == NEW
    ties = [j for j, m in enumerate(margins) if m < NEAR_TIE]
    upto = ties[0] if ties else NEW
    _stats["rows"] += 1
    _stats["near_ties"] += bool(ties)
    mismatch = [j for j in range(upto) if spec[j] != ref[j]]
    assert not mismatch, f"prompt {i}: diverged at {mismatch[0]} with plain margin {margins[mismatch[0]]:.2e}"


def test_report_near_tie_rate():
  if _stats["rows"]:
    print(f"\nnear-tie rows: {_stats['near_ties']}/{_stats['rows']} "
          f"(rows whose plain path had a top-2 gap < {NEAR_TIE})")
  assert _stats["near_ties"] <= 0.2 * max(_stats["rows"], 1)
