"""The notebooks in colabs/ run top to bottom on the CPU."""

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["quickstart.ipynb"])
def test_notebook_executes(name, tmp_path):
    nb = nbformat.read(REPO / "colabs" / name, as_version=4)
    os.environ["RLVR_JAX_ROOT"] = str(REPO)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    outputs = "".join(
        o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs
    )
    assert "->" in outputs and "parameters" in outputs
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images
