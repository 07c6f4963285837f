"""Runs one jspec command as several JAX processes on this machine (multi-controller JAX over
loopback): `python -m jspec.launch --processes 2 --local-devices 4 -- jspec generate "hi" --mesh
data=2,model=4 --drafter ngram`.

Each process gets JSPEC_COORDINATOR / JSPEC_NUM_PROCESSES / JSPEC_PROCESS_ID, which
`jspec.sharding.initialize_from_env` turns into `jax.distributed.initialize` (the CLI calls it
first), and, with --local-devices N, N host CPU devices. Every process runs the same program over
the global mesh; process 0's standard output is forwarded (the others' goes to stderr with a
prefix), and the exit status is the first failure's, the other processes being stopped then.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import threading


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _forward(stream, sink, prefix: str) -> None:
  for line in iter(stream.readline, ""):
    if line.startswith("[Gloo]"):     # the CPU collectives library's connection chatter
      continue
    sink.write(prefix + line)
    sink.flush()


def launch(command: list[str], processes: int, local_devices: int | None = None,
           port: int | None = None) -> int:
  """Runs `command` in `processes` processes; returns the exit status (0 when all succeed)."""
  if processes < 1:
    raise ValueError(f"--processes must be >= 1, got {processes}")
  if not command:
    raise ValueError("give the command to run after '--', e.g. -- jspec generate hi")
  if command[0] == "jspec" and shutil.which("jspec") is None:
    command = [sys.executable, "-m", "jspec.cli"] + command[1:]
  port = port or free_port()
  procs, threads = [], []
  for rank in range(processes):
    env = dict(os.environ, JSPEC_COORDINATOR=f"127.0.0.1:{port}",
               JSPEC_NUM_PROCESSES=str(processes), JSPEC_PROCESS_ID=str(rank))
    if local_devices:
      flags = env.get("XLA_FLAGS", "")
      env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={local_devices}".strip()
      env.setdefault("JAX_PLATFORMS", "cpu")
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    sink, prefix = (sys.stdout, "") if rank == 0 else (sys.stderr, f"[process {rank}] ")
    thread = threading.Thread(target=_forward, args=(proc.stdout, sink, prefix), daemon=True)
    thread.start()
    procs.append(proc)
    threads.append(thread)
  status = 0
  try:
    pending = list(procs)
    while pending:
      for proc in list(pending):
        try:
          code = proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
          continue
        pending.remove(proc)
        if code and not status:
          status = code
          for other in pending:     # one failed: the others would wait on it forever
            other.terminate()
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
    for thread in threads:
      thread.join(timeout=5)
  return status


def main(argv: list[str] | None = None) -> None:
  argv = sys.argv[1:] if argv is None else argv
  split = argv.index("--") if "--" in argv else len(argv)
  parser = argparse.ArgumentParser(
      prog="python -m jspec.launch",
      description="Run a jspec command as several JAX processes on this machine (loopback).")
  parser.add_argument("--processes", type=int, default=2)
  parser.add_argument("--local-devices", type=int, default=None,
                      help="host CPU devices per process (CPU runs; GPUs/TPUs come as they are)")
  parser.add_argument("--port", type=int, default=None, help="coordinator port (default: free)")
  args = parser.parse_args(argv[:split])
  try:
    sys.exit(launch(argv[split + 1:], args.processes, args.local_devices, args.port))
  except ValueError as e:
    sys.exit(f"jspec.launch: {e}")


if __name__ == "__main__":
  main()
