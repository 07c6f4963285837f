"""Loading a benchmarks/scripts file as a module (the scripts are not a package), for their
tests."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(name: str):
  """benchmarks/scripts/<name>.py as a module."""
  spec = importlib.util.spec_from_file_location(
      name, os.path.join(ROOT, "benchmarks", "scripts", f"{name}.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod
