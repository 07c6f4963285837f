"""The command line under bad input and faults: every case fails with one clear line before the
model loads where it can, a report is never lost or left half-written, and Ctrl-C exits 130 with
one line and no traceback."""

import errno
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

import models
from jspec import cli, cli_args
from jspec import io as jio
from jspec.bench import speedup


@pytest.fixture(scope="module")
def tiny_loaded(tiny_loaded_factory):
  return tiny_loaded_factory(0)


@pytest.fixture
def no_load(monkeypatch):
  monkeypatch.setattr(cli_args, "load_model", lambda name, *_: pytest.fail("loaded a model"))


@pytest.fixture
def prompts(tmp_path):
  f = tmp_path / "p.jsonl"
  f.write_text(json.dumps(dict(id="a", category="x", prompt="p")) + "\n")
  return str(f)


def _exit_message(argv) -> str:
  with pytest.raises(SystemExit) as e:
    cli.main(argv)
  assert isinstance(e.value.code, str), e.value.code     # a message, not a bare status
  return e.value.code


# -- request validation --------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["generate", "hi", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
    (["generate", "hi", "--max-new-tokens", "-5"], "--max-new-tokens must be >= 1, got -5"),
    (["generate", b"caf\xe9!".decode("utf-8", "surrogateescape")],
     r"the prompt is not valid UTF-8 \(byte 0xe9 at character 3\); pass UTF-8 text"),
    (["generate", "hi", "--system", b"\xff".decode("utf-8", "surrogateescape")],
     "--system is not valid UTF-8"),
    (["bench", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["bench", "--repeats", "0"], "--repeats must be >= 1"),
    (["bench", "--per-category", "0"], "--per-category must be >= 1"),
    (["bench-decode", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["bench-decode", "--batch-sizes", "1,x"], "--batch-sizes takes comma-separated integers"),
    (["generate", "hi", "--mesh", "model4"], "write axis=size pairs such as 'data=2,model=4'"),
    (["generate", "hi", "--mesh", "model=64"], "needs 64 devices"),
])
def test_bad_values_fail_before_the_model_loads(argv, message, no_load, prompts):
  if argv[0] == "bench":
    argv = argv + ["--prompts", prompts]
  assert re.search(message, _exit_message(argv))


@pytest.mark.parametrize("value", ["2147483647", "10000000000"])
def test_overflowing_max_new_tokens(value, tiny_loaded, monkeypatch, prompts):
  """Compared as Python ints (no int32 wrap, no OverflowError), before any compilation."""
  monkeypatch.setattr(cli_args, "load_model", lambda name, *_: tiny_loaded)
  msg = _exit_message(["generate", "hi", "--raw", "--max-new-tokens", value])
  assert f"prompt 0 (2 tokens) + max_new_tokens ({value}) exceeds the model's context of 512; " \
         "lower max_new_tokens to at most 510" in msg
  monkeypatch.setattr(speedup, "run", lambda *a, **k: pytest.fail("ran the bench"))
  msg = _exit_message(["bench", "--prompts", prompts, "--max-new-tokens", value])
  assert f"the longest prompt (18 tokens) + --max-new-tokens ({value}) exceeds the model's " \
         "context of 512; lower --max-new-tokens to at most 494" in msg


@pytest.mark.parametrize("command", [["generate", "hi", "--raw"], ["bench-decode"]])
def test_weights_and_cache_reach_the_loader(command, monkeypatch):
  """--weights and --kv-cache are passed to the loader (checked before any work); an unknown
  format or cache dtype is refused, and so is a bad kv_cache through the API."""
  seen = []

  def load(name, weights="f32", kv_cache="f32"):
    seen.append((weights, kv_cache))
    raise SystemExit("stop")
  monkeypatch.setattr(cli_args, "load_model", load)
  with pytest.raises(SystemExit):
    cli.main(command + ["--weights", "int8", "--kv-cache", "bf16"])
  assert seen == [("int8", "bf16")]
  for bad in (["--weights", "q4_k"], ["--kv-cache", "fp8"]):
    with pytest.raises(SystemExit) as e:
      cli.main(command + bad)
    assert e.value.code == 2 and seen == [("int8", "bf16")]
  with pytest.raises(models.ModelLoadError, match="kv_cache must be one of f32, bf16"):
    models.load(kv_cache="fp8")


def test_model_file_not_found():
  assert "model file not found: 'missing.gguf'" in _exit_message(
      ["generate", "hi", "--model", "missing.gguf"])


# -- output files: checked before the run ----------------------------------------------------------

def _read_only(folder, monkeypatch):
  folder.chmod(0o555)
  if os.access(folder, os.W_OK):   # root ignores the mode: refuse new files as the OS would
    real = jio.tempfile.mkstemp

    def mkstemp(*a, dir=None, **k):
      if dir == str(folder):
        raise PermissionError(errno.EACCES, "Permission denied")
      return real(*a, dir=dir, **k)
    monkeypatch.setattr(jio.tempfile, "mkstemp", mkstemp)


@pytest.mark.parametrize("where, message", [
    ("missing", "the folder {d}/missing does not exist; create it or choose another path"),
    ("read_only", "cannot write {d}/read_only/r.json: Permission denied"),
    ("under_a_file", "cannot write {d}/under_a_file/r.json: {d}/under_a_file is a file, not a "
     "folder"),
])
@pytest.mark.parametrize("command", ["bench", "bench-decode"])
def test_unwritable_report_fails_before_the_run(command, where, message, tmp_path, monkeypatch,
                                                no_load, prompts):
  d = tmp_path / "out"
  d.mkdir()
  (d / "under_a_file").write_text("a file")
  (d / "read_only").mkdir()
  _read_only(d / "read_only", monkeypatch)
  try:
    argv = [command, "--json", str(d / where / "r.json")]
    msg = _exit_message(argv + (["--prompts", prompts] if command == "bench" else []))
    assert message.format(d=d) in msg
    assert os.listdir(d / "read_only") == [] and (d / "under_a_file").read_text() == "a file"
    assert sorted(os.listdir(d)) == ["read_only", "under_a_file"]
  finally:
    (d / "read_only").chmod(0o755)


def test_unwritable_plot_folder_fails_before_the_run(tmp_path, no_load, prompts):
  (tmp_path / "f").write_text("")
  msg = _exit_message(["bench", "--prompts", prompts, "--plot", str(tmp_path / "f" / "plots")])
  assert f"cannot create the folder {tmp_path}/f/plots" in msg


# -- output files: written whole, never lost -------------------------------------------------------

FAKE_REPORT = dict(schema="jspec.bench/1", results=[])


@pytest.fixture
def fake_bench(tiny_loaded, monkeypatch):
  monkeypatch.setattr(cli_args, "load_model", lambda name, *_: tiny_loaded)
  monkeypatch.setattr(speedup, "run", lambda *a, **k: dict(FAKE_REPORT))


def test_full_disk_at_the_end_keeps_the_older_report_and_saves_the_new_one_elsewhere(
    tmp_path, monkeypatch, capsys, fake_bench, prompts):
  out = tmp_path / "out"
  out.mkdir()
  (out / "r.json").write_text("older report")
  fallback = tmp_path / "fallback"
  fallback.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(fallback))
  real_fsync = jio.os.fsync

  def fsync(fd):   # the disk under out/ is full; the fallback folder is not
    if os.readlink(f"/proc/self/fd/{fd}").startswith(str(out)):
      raise OSError(errno.ENOSPC, "No space left on device")
    real_fsync(fd)
  monkeypatch.setattr(jio.os, "fsync", fsync)
  msg = _exit_message(["bench", "--prompts", prompts, "--json", str(out / "r.json")])
  saved = fallback / f"jspec-bench-{os.getpid()}.json"
  assert msg == f"jspec: the report is in {saved}"
  assert f"could not write {out}/r.json: No space left on device" in capsys.readouterr().err
  assert json.loads(saved.read_text())["schema"] == "jspec.bench/1"
  assert os.listdir(out) == ["r.json"] and (out / "r.json").read_text() == "older report"


def test_interrupt_in_process(tmp_path, monkeypatch, capsys, tiny_loaded, prompts):
  def run(*a, **k):
    raise KeyboardInterrupt
  monkeypatch.setattr(cli_args, "load_model", lambda name, *_: tiny_loaded)
  monkeypatch.setattr(speedup, "run", run)
  (tmp_path / "r.json").write_text("older report")
  with pytest.raises(SystemExit) as e:
    cli.main(["bench", "--prompts", prompts, "--json", str(tmp_path / "r.json")])
  assert e.value.code == 130
  err = capsys.readouterr().err
  assert err == (f"jspec bench: interrupted; nothing was saved ({tmp_path}/r.json not written; "
                 "any older copy is untouched)\n")
  assert sorted(os.listdir(tmp_path)) == ["p.jsonl", "r.json"]
  assert (tmp_path / "r.json").read_text() == "older report"


def test_interrupt_note_of_a_command_that_saves_as_it_goes(monkeypatch, capsys):
  def generate(args):
    args.interrupt_note = "checkpoints up to step 7 are in out/; rerun to resume"
    raise KeyboardInterrupt
  monkeypatch.setattr(cli, "cmd_generate", generate)
  with pytest.raises(SystemExit) as e:
    cli.main(["generate", "hi"])
  assert e.value.code == 130
  assert capsys.readouterr().err == ("jspec generate: interrupted; checkpoints up to step 7 are "
                                     "in out/; rerun to resume\n")


def _tiny_hf_folder(folder) -> None:
  """A 1-layer random Llama with a byte-level tokenizer and a chat template: `--model FOLDER`."""
  from safetensors.numpy import save_file
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers

  alphabet = pre_tokenizers.ByteLevel.alphabet()
  tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(sorted(alphabet))}, merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens(["<eos>"])
  tok.save(str(folder / "tokenizer.json"))
  (folder / "tokenizer_config.json").write_text(json.dumps(dict(
      eos_token="<eos>",
      chat_template="{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")))
  v, h, i, heads, kv, hd = 264, 32, 64, 2, 1, 16
  (folder / "config.json").write_text(json.dumps(dict(
      model_type="llama", vocab_size=v, hidden_size=h, intermediate_size=i, num_hidden_layers=1,
      num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd, tie_word_embeddings=True,
      max_position_embeddings=1024)))
  rng = np.random.default_rng(0)
  w = lambda *s: (0.2 * rng.standard_normal(s)).astype(np.float32)
  p = "model.layers.0."
  save_file({"model.embed_tokens.weight": w(v, h), "model.norm.weight": np.ones(h, np.float32),
             p + "input_layernorm.weight": np.ones(h, np.float32),
             p + "post_attention_layernorm.weight": np.ones(h, np.float32),
             p + "self_attn.q_proj.weight": w(heads * hd, h),
             p + "self_attn.k_proj.weight": w(kv * hd, h),
             p + "self_attn.v_proj.weight": w(kv * hd, h),
             p + "self_attn.o_proj.weight": w(h, heads * hd),
             p + "mlp.gate_proj.weight": w(i, h), p + "mlp.up_proj.weight": w(i, h),
             p + "mlp.down_proj.weight": w(h, i)}, str(folder / "model.safetensors"))


def test_ctrl_c_inside_a_finaliser_is_quiet():
  """Ctrl-C landing inside a finaliser (seen in CI: jax's gc callback) is swallowed by Python;
  it must not print Python's "Exception ignored" traceback, and the watchdog still ends the run
  with exit 130 and the one line."""
  code = ("import os, signal, time, sys\n"
          "from jspec import cli\n"
          "cli._watch_sigint([None])\n"
          "class A:\n"
          "  def __del__(self):\n"
          "    os.kill(os.getpid(), signal.SIGINT)\n"
          "    time.sleep(0.5)\n"
          "A()\n"
          "time.sleep(60)\n")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 130, proc.stderr
  assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
  assert "interrupted" in proc.stderr


def test_ctrl_c_during_bench(tmp_path):
  """The real thing: `jspec bench` in a subprocess, SIGINT once measured runs are under way (the
  progress bar has moved, so warm-up and compilation are done): exit 130, one line, no traceback,
  the older report untouched, no partial file anywhere."""
  model = tmp_path / "model"
  model.mkdir()
  _tiny_hf_folder(model)
  (tmp_path / "p.jsonl").write_text(json.dumps(dict(id="a", category="x", prompt="hello")) + "\n")
  out = tmp_path / "out"
  out.mkdir()
  (out / "r.json").write_text("older report")
  cmd = [sys.executable, "-m", "jspec.cli", "bench", "--prompts", str(tmp_path / "p.jsonl"),
         "--model", str(model), "--drafters", "ngram", "--num-draft", "1", "--batch-size", "1",
         "--max-new-tokens", "4", "--repeats", "1000000", "--json", str(out / "r.json"),
         "--plot", str(out / "plots")]
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
  err = bytearray()
  reader = threading.Thread(target=lambda: [err.extend(c) for c in iter(
      lambda: proc.stderr.read1(4096), b"")], daemon=True)
  reader.start()
  deadline = time.monotonic() + 120
  while not re.search(rb"\| *[1-9]\d*/\d+", bytes(err)):   # tqdm: "| 3/2000000 [..."
    assert proc.poll() is None, bytes(err).decode(errors="replace")
    assert time.monotonic() < deadline, "the bench did not start its measured runs"
    time.sleep(0.1)
  proc.send_signal(signal.SIGINT)
  try:
    rc = proc.wait(timeout=60)
  finally:
    proc.kill()
  reader.join(timeout=5)
  stdout = proc.stdout.read().decode()
  text = bytes(err).decode(errors="replace")
  assert rc == 130, text
  assert "Traceback" not in text and "Error" not in text, text
  last = text.replace("\r", "\n").rstrip("\n").split("\n")[-1]
  assert last == (f"jspec bench: interrupted; nothing was saved ({out}/r.json, {out}/plots/ "
                  "not written; any older copy is untouched)")
  assert stdout == ""
  assert sorted(os.listdir(out)) == ["plots", "r.json"] and os.listdir(out / "plots") == []
  assert (out / "r.json").read_text() == "older report"


def test_generate_times_warm_runs_and_the_suffix_cache_starts_empty(tiny_loaded, monkeypatch,
                                                                    capsys):
  """With a drafter, each decoder runs once untimed before its timed run, and the timed run's
  suffix drafter has forgotten the warm-up's reply: its acceptance is a fresh decoder's."""
  from jspec.spec_decode import SpecDecoder
  monkeypatch.setattr(cli_args, "load_model", lambda name, *_: tiny_loaded)
  real, calls = SpecDecoder.generate, []
  monkeypatch.setattr(SpecDecoder, "generate",
                      lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
  prompt = "abc abc abc abc abc"
  cli.main(["generate", prompt, "--raw", "--max-new-tokens", "24", "--json", "--drafter",
            "suffix", "--num-draft", "3"])
  record = json.loads(capsys.readouterr().out)
  assert len(calls) == 2
  tok = tiny_loaded.tokenizer
  fresh = real(SpecDecoder(tiny_loaded.model, {"method": "suffix", "num_speculative_tokens": 3},
                           eos_ids=tok.eos_ids), [tok.encode(prompt)], max_new_tokens=24)
  assert record["token_ids"] == fresh.token_ids[0]
  assert record["acceptance_length"] == pytest.approx(fresh.acceptance_length)


@pytest.mark.parametrize("drafter, want", [
    ("ngram", "auto"), ("eagle3", "auto"), ("draft-model", "auto"), ("medusa", 3),
    ("eagle3:tree_top_k=3:tree_depth=4", 3), ("mtp:tree_top_k=2:tree_depth=3", 3),
    ("medusa:tree_choices=auto", 3), ("dspark:confidence_schedule=true", 3)])
def test_generate_defaults_to_auto_for_chains(drafter, want):
  """`generate --num-draft` unset: the adaptive length where the round may cut the chain, a fixed 3
  for trees (a node budget), DSpark's confidence schedule and Medusa (one draft per head); a given
  --num-draft is kept."""
  args = cli._parse(["generate", "hi", "--drafter", drafter.split(":")[0]])
  cfg = cli_args.spec_config(drafter, None, args)
  assert cfg.num_speculative_tokens == want
  assert cfg.adaptive == (want == "auto")
  assert cli_args.spec_config(drafter, 2, args).num_speculative_tokens == 2


def test_compiled_programs_persist_in_the_jspec_cache(monkeypatch, tmp_path):
  """The CLI keeps XLA's compiled programs in $JSPEC_CACHE/xla unless JAX_COMPILATION_CACHE_DIR is
  set (the tests set it: their per-run cache stays)."""
  import jax
  before = (jax.config.jax_compilation_cache_dir,
            jax.config.jax_persistent_cache_min_compile_time_secs)
  try:
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/elsewhere")
    cli._compilation_cache()
    assert jax.config.jax_compilation_cache_dir == before[0]
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    monkeypatch.setenv("JSPEC_CACHE", str(tmp_path))
    cli._compilation_cache()
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla")
  finally:
    jax.config.update("jax_compilation_cache_dir", before[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])


def test_a_shared_drafter_flag_names_every_method_that_takes_it():
  """--tree-top-k is declared by eagle3, mtp and hybrid, --head by eagle3 and hybrid: the help
  names each method whose config the flag reaches (spec_config reads it for all of them)."""
  import argparse
  from jspec.drafters import registry
  parser = argparse.ArgumentParser()
  cli_args.add_drafter_flags(parser)
  text = " ".join(parser.format_help().split())
  for flag in ("--tree-top-k", "--head"):
    takers = [e.cli_name for e in registry.methods().values()
              if any(f.flag == flag for f in e.cli_flags)]
    assert len(takers) >= 2 and f"[{', '.join(takers)}]" in text, (flag, takers)
