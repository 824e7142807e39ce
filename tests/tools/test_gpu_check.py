"""tools/gpu_check.sh's dry run: the GPU efficiency step on tiny shapes on the CPU, end to end."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_gpu_script_dry_runs_on_the_cpu(tmp_path):
    out = tmp_path / "gpu"
    done = subprocess.run(["bash", "tools/gpu_check.sh", "--device", "cpu", "--out", str(out)], cwd=REPO,
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # the whole grid on llama-tiny; one cell on qwen2-tiny, which still builds and runs that shape end to end
    grids = {"llama-tiny": ({(m, c, a, k) for m in ("serial", "pipelined") for c in (1, 2) for a in (0.5, 0.7, 0.9)
                             for k in ("policy", 4)}, [0.5, 0.7, 0.9]),
             "qwen2-tiny": ({("serial", 1, 0.7, 4)}, [0.7])}
    for shape, (grid, anchor_alphas) in grids.items():
        result = json.loads((out / f"efficiency_{shape}" / "efficiency.json").read_text())
        cells = {(r["mode"], r["concurrency"], r["alpha"], r["k"]) for r in result["rows"]}
        assert cells == grid
        assert all({"forward_ms", "draft_wait_ms", "transport_ms"} <= set(r) for r in result["rows"])
        assert [a["alpha"] for a in result["anchor"]] == anchor_alphas
        assert all(a["outputs_equal"] == "1/1" for a in result["anchor"])  # assisted generation stays lossless
    assert "torch" in (out / "machine.txt").read_text()


def test_the_gpu_script_refuses_an_unknown_device():
    done = subprocess.run(["bash", "tools/gpu_check.sh", "--device", "tpu"], cwd=REPO, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 2 and "--device cuda or cpu" in done.stderr
