"""GPU assignment with real tasks (plain Python): each task of `tfdist launch --workers gpu` and
of `tfdist.launch` sees only its own GPUs, on GPU lists simulated with TFDIST_GPUS (this host has
no GPU). The pure assignment and the refusals: tests/unit/test_launcher_gpus.py."""

import io
import os
import subprocess
import sys

from tfdist.launcher import launch

from helpers.launcher import _script

PRINT_GPUS = """
    import os
    print("gpus", os.environ["TFDIST_TASK"], repr(os.environ.get("CUDA_VISIBLE_DEVICES")),
          os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH"))
"""


def _seen(output: str) -> dict:
    seen = {}
    for line in output.splitlines():
        if " gpus " in line:
            _, _, task, devices, growth = line.split()
            seen[task] = (eval(devices), growth)  # noqa: S307 (the script's own repr)
    return seen


def test_launch_workers_gpu_gives_each_task_its_own_gpus(tmp_path):
    script = _script(tmp_path, PRINT_GPUS)
    env = dict(os.environ, TFDIST_GPUS="4")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run(
        [sys.executable, "-m", "tfdist", "launch", "--workers", "gpu", "--gpus-per-worker", "2",
         "--evaluator", script],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert _seen(done.stdout) == {
        "worker:0": ("0,1", "None"),
        "worker:1": ("2,3", "None"),
        "evaluator:0": ("", "None"),  # no GPU unless asked
    }


def test_a_scheduler_s_gpus_are_shared_out_in_its_order_and_shared_gpus_grow(tmp_path, monkeypatch):
    script = _script(tmp_path, PRINT_GPUS)
    monkeypatch.delenv("TFDIST_GPUS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,2")  # what a scheduler gave this job
    out = io.StringIO()
    assert launch(script, workers=2, out=out) == {"worker:0": 0, "worker:1": 0}
    assert _seen(out.getvalue()) == {"worker:0": ("6", "None"), "worker:1": ("2", "None")}
    out = io.StringIO()
    assert launch(script, workers=2, gpus_per_worker="shared", out=out)["worker:1"] == 0
    assert _seen(out.getvalue()) == {"worker:0": ("6,2", "true"), "worker:1": ("6,2", "true")}
