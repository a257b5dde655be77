"""Both notebooks run headless, top to bottom, in their CPU fallback with a few steps; any cell error fails."""

from __future__ import annotations

import os

import nbformat
import pytest
from nbclient import NotebookClient


NOTEBOOKS = os.path.join(os.path.dirname(__file__), "..", "notebooks")


@pytest.mark.parametrize("name", ["quickstart.ipynb", "compare_methods.ipynb"])
def test_notebook_runs(name, tmp_path, monkeypatch):
    monkeypatch.setenv("ADAPTIVE_KL_NOTEBOOK_STEPS", "2")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend turns figures into outputs
    notebook = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, "the notebook shows its plots"
