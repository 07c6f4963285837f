"""Greedy speculative decoding replayed from teacher-forced draft predictions.

Over a prompt followed by the target's own greedy reply, greedy chain drafting is deterministic:
a round whose last committed token sits at position L-1 drafts tokens L, L+1, ... and accepts the
longest prefix equal to the reply; the next round starts after the accepted tokens and the target's
bonus token. A drafter whose prediction for token t+2+j after anchor t can be computed
teacher-forced (EAGLE-3's training-time test does exactly this) therefore reproduces, in one
batched pass per sequence and no decoding, the rounds and acceptance that `SpecDecoder` measures
on the same reply (tested against it). `jspec train replay` uses it to measure a head's acceptance
length per prompt category at any draft length, cheaply enough to score every checkpoint.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class Replay:
  rounds: int = 0          # verify passes
  emitted: int = 0         # tokens committed by rounds (the first token comes from prefill)
  accepted_at: np.ndarray | None = None   # [D] rounds in which draft position i was accepted

  @property
  def acceptance_length(self) -> float:
    return self.emitted / max(self.rounds, 1)

  def add(self, other: "Replay") -> None:
    self.rounds += other.rounds
    self.emitted += other.emitted
    self.accepted_at = (other.accepted_at if self.accepted_at is None
                        else self.accepted_at + other.accepted_at)


def replay_greedy(preds: np.ndarray, tokens: np.ndarray, prompt_len: int, end: int) -> Replay:
  """preds [D, N]: preds[j, t] the drafter's token for position t+2+j after anchor t (its own
  drafts fed back for j > 0); tokens [N]: the prompt (prompt_len tokens) and the target's greedy
  reply up to `end`, as `SpecDecoder.generate(max_new_tokens=end - prompt_len, eos=False)` makes
  it. Returns the rounds, emitted tokens and per-position acceptance of that generation (a last
  round cut by the budget counts only the drafts inside the reply; the decoder may also accept
  drafts past it)."""
  d = preds.shape[0]
  if not 1 <= prompt_len < end <= len(tokens):
    raise ValueError(f"need 1 <= prompt_len < end <= len(tokens), got {prompt_len}, {end}, "
                     f"{len(tokens)}")
  out = Replay(accepted_at=np.zeros(d, np.int64))
  t = prompt_len - 1       # anchor: committed tokens end at t + 1 (prefill made token prompt_len)
  while t + 2 < end:
    r = 0
    while r < d and t + 2 + r < end and preds[r, t] == tokens[t + 2 + r]:
      r += 1
    out.rounds += 1
    out.emitted += min(r + 1, end - (t + 2))
    out.accepted_at[:r] += 1
    t += r + 1
  return out


def greedy_replies(target, prompts, *, max_new_tokens: int, eos_ids=(),
                   batch_size: int = 8) -> list[list[int]]:
  """The target's greedy replies to token-id prompts, each ending at its first EOS (`eos_ids`, kept)
  or after max_new_tokens, as `jspec bench` runs them."""
  from jspec.decode import Decoder

  if max_new_tokens < 2:
    raise ValueError(f"max_new_tokens must be >= 2 to replay rounds, got {max_new_tokens}")
  dec = Decoder(target, eos_ids=eos_ids)
  out = []
  for i in range(0, len(prompts), batch_size):
    out += [list(r) for r in dec.generate(prompts[i:i + batch_size],
                                          max_new_tokens=max_new_tokens).token_ids]
  return out


def replay_prompts(prompts, replies, predict, *, bucket: int = 256) -> dict[str, Replay]:
  """prompts: [(category, token ids)], replies: the target's greedy reply to each
  (`greedy_replies`); predict(tokens [1, N]) -> [1, D, N] (jitted; N a multiple of `bucket`).
  Returns {category: Replay} with "all" pooled."""
  import jax.numpy as jnp

  if len(prompts) != len(replies):
    raise ValueError(f"{len(prompts)} prompts but {len(replies)} replies")
  out: dict[str, Replay] = {}
  for (category, ids), reply in zip(prompts, replies):
    if len(reply) < 2:
      continue
    seq = np.asarray(list(ids) + list(reply), np.int32)
    padded = np.zeros(-(-len(seq) // bucket) * bucket, np.int32)
    padded[:len(seq)] = seq
    preds = np.asarray(predict(jnp.asarray(padded)[None]))[0]
    r = replay_greedy(preds, seq, len(ids), len(seq))
    for key in (category, "all"):
      out.setdefault(key, Replay()).add(r)
  return out
