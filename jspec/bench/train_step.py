"""The training step of the learned heads in float32 and in mixed precision (`--compute-dtype`),
interleaved in one process on the default model; JSON out.

  python -m jspec.bench.train_step --json benchmarks/results/train_step/cpu.json
      [--heads eagle3,mtp] [--batch-size 8] [--seq-len 512] [--steps 5]

One step is `jspec train`'s: the loss over a batch read from the feature cache (3 TTT / MTP steps,
an 8,192-token draft vocabulary), its gradient and the AdamW update. Rows are full (every position
a token, the last three quarters reply tokens), so positions/s is the rate at no padding; a real
run's tokens/s is lower by its padding share (conversations shorter than --seq-len).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jspec.io import atomic_write_text, check_writable

DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16}
HEADS = ("eagle3", "mtp")
DRAFT_VOCAB = 8192


def make_task(name: str, target, compute_dtype):
  from jspec.train import eagle3, mtp
  ids = np.arange(min(DRAFT_VOCAB, target.config.vocab_size), dtype=np.int32)
  if name == "eagle3":
    return eagle3.eagle3_task(target, ids, ttt_steps=3, compute_dtype=compute_dtype)
  return mtp.mtp_task(target, ids, steps=3, compute_dtype=compute_dtype)


def batch(cfg, b: int, n: int, taps: int, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  mask = (np.arange(n) >= n // 4).astype(np.int32)
  return dict(tokens=jnp.asarray(rng.integers(0, cfg.vocab_size, (b, n)), jnp.int32),
              loss_mask=jnp.asarray(np.broadcast_to(mask, (b, n))),
              length=jnp.full((b,), n, jnp.int32),
              feats=jnp.asarray(rng.standard_normal((b, n, taps + 1, cfg.hidden_size)),
                                jnp.bfloat16))


def step_fn(task, opt):
  import optax

  @jax.jit
  def step(params, opt_state, aux, batch):
    (loss, _), grads = jax.value_and_grad(task.loss, has_aux=True)(params, aux, batch)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss
  return step


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--json", required=True)
  p.add_argument("--heads", default=",".join(HEADS))
  p.add_argument("--batch-size", type=int, default=8)
  p.add_argument("--seq-len", type=int, default=512)
  p.add_argument("--steps", type=int, default=5, help="timed steps per variant (interleaved)")
  p.add_argument("--tiny", action="store_true", help="a tiny random model (a smoke test)")
  args = p.parse_args(argv)
  heads = [h for h in args.heads.split(",") if h]
  bad = [h for h in heads if h not in HEADS]
  if bad or not heads:
    sys.exit(f"jspec: --heads takes a comma list of {', '.join(HEADS)}; got {args.heads!r}")
  if min(args.batch_size, args.seq_len, args.steps) < 1:
    sys.exit("jspec: --batch-size, --seq-len and --steps must be >= 1")
  try:
    check_writable(args.json, create_folder=True)
  except ValueError as e:
    sys.exit(f"jspec: {e}")

  import models
  from jspec.train import trainer
  if args.tiny:
    from flax import nnx
    target = models.Llama(models.LlamaConfig.tiny(vocab_size=64, num_layers=4), rngs=nnx.Rngs(0))
  else:
    target = models.load(quiet=True).model
  opt = trainer.optimizer(trainer.TrainConfig(steps=1000, warmup=10))
  data = batch(target.config, args.batch_size, args.seq_len, taps=3)
  results = []
  for head in heads:
    runs = {}
    for name, dt in DTYPES.items():
      task = make_task(head, target, dt)
      fn = step_fn(task, opt)
      state = (task.params, opt.init(task.params))
      t0 = time.perf_counter()
      params, st, loss = fn(*state, task.aux, data)
      loss.block_until_ready()
      runs[name] = dict(fn=fn, state=(params, st), aux=task.aux, times=[],
                        compile_s=time.perf_counter() - t0)
    for _ in range(args.steps):              # interleaved: fp32, bf16, fp32, ...
      for r in runs.values():
        t = time.perf_counter()
        params, st, loss = r["fn"](*r["state"], r["aux"], data)
        loss.block_until_ready()
        r["times"].append(time.perf_counter() - t)
        r["state"] = (params, st)
    positions = args.batch_size * args.seq_len
    for name, r in runs.items():
      med = statistics.median(r["times"])
      results.append(dict(head=head, compute_dtype=name, step_s=med, positions_per_s=positions / med,
                          times_s=r["times"], first_call_s=r["compile_s"]))
    fp32, bf16 = (statistics.median(runs[k]["times"]) for k in DTYPES)
    print(f"{head}: fp32 {fp32:.2f} s, bf16 {bf16:.2f} s per step ({positions / bf16:.0f} "
          f"positions/s), {fp32 / bf16:.2f}x", file=sys.stderr)
  out = dict(benchmark="train_step", model="tiny" if args.tiny else "default",
             device=jax.devices()[0].device_kind, jax=jax.__version__,
             machine=platform.machine(), batch_size=args.batch_size, seq_len=args.seq_len,
             draft_vocab=min(DRAFT_VOCAB, target.config.vocab_size), ttt_steps=3,
             results=results)
  atomic_write_text(args.json, json.dumps(out, indent=2))


if __name__ == "__main__":
  main()
