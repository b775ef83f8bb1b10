"""notebooks/value_curves.ipynb: saved clean, and it runs against a tiny run producing figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT
from test_evaluate import tiny_run

NOTEBOOK = ROOT / "notebooks" / "value_curves.ipynb"
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


def test_notebook_is_saved_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and params[0].source.strip() == 'RUN_DIR = "runs/demo"'


def test_notebook_executes_and_draws(tmp_path_factory, toy_data):
    run_dir = tiny_run(tmp_path_factory, toy_data)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        if "parameters" in cell.metadata.get("tags", []):
            cell.source = f"RUN_DIR = {json.dumps(str(run_dir))}"
    # Raises CellExecutionError (with the cell and traceback) when any cell fails.
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 7, [o.get("data", {}).keys() for o in outputs]  # 6 curves + calibration
    assert any("best val loss" in o.get("data", {}).get("text/markdown", "") for o in outputs)
    assert list((Path(run_dir) / "eval").glob("step_*-val.json"))  # the cached calibration
