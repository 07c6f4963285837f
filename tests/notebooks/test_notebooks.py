"""Every notebook in notebooks/ runs top to bottom (nbclient, a fresh Python kernel) with the small
budget (JSPEC_NOTEBOOK_BUDGET=small: fewer prompts, tokens and drafters), its figure written to a
temporary folder; and a deliberately broken copy fails, so a raising cell cannot pass unnoticed."""

from __future__ import annotations

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

FOLDER = pathlib.Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(FOLDER.glob("*.ipynb"))


def _run(nb, tmp_path, monkeypatch):
  monkeypatch.setenv("JSPEC_NOTEBOOK_BUDGET", "small")
  monkeypatch.setenv("JSPEC_NOTEBOOK_FIGURES", str(tmp_path))
  client = NotebookClient(nb, timeout=600, kernel_name="python3",
                          resources={"metadata": {"path": str(FOLDER)}})
  client.execute()
  return nb


def test_the_four_notebooks_are_there_and_committed_without_outputs():
  assert [p.stem for p in NOTEBOOKS] == ["01_quickstart", "02_acceptance", "03_codesign",
                                         "04_kernels"]
  for path in NOTEBOOKS:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code), path.name


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, tmp_path, monkeypatch):
  nb = _run(nbformat.read(path, as_version=4), tmp_path, monkeypatch)
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if o.output_type == "error"]
  assert not errors
  figure = tmp_path / f"{path.stem}.png"
  assert figure.stat().st_size > 10_000, f"{path.name} did not save its figure"


def test_a_broken_copy_fails(tmp_path, monkeypatch):
  nb = nbformat.read(FOLDER / "04_kernels.ipynb", as_version=4)
  nb.cells.insert(2, nbformat.v4.new_code_cell("raise RuntimeError('deliberately broken cell')"))
  with pytest.raises(CellExecutionError, match="deliberately broken cell"):
    _run(nb, tmp_path, monkeypatch)
