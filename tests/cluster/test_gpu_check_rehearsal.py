"""The prepared GPU check (`make test-gpu`, tests/gpu/gpu_check.py) rehearsed on this CPU host:
its own venv built as on a GPU host (uv bootstrapped with pip, TensorFlow without CUDA), every
step run on CPUs (logical CPUs for logical GPUs, a simulated GPU for the launcher), and the
Markdown and JSON results; then run as on a GPU host whose TensorFlow sees no GPU, where each
step fails on its own with that reason and the others still run."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

CHECK = pathlib.Path(__file__).resolve().parents[1] / "gpu" / "gpu_check.py"
_SPEC = importlib.util.spec_from_file_location("gpu_check_runner", CHECK)
_RUNNER = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_RUNNER)
STEPS = list(_RUNNER.STEPS)


def _check(tmp_path, *arguments, timeout=900):
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out))
    env.pop("TFDIST_GPUS", None)
    done = subprocess.run(
        [sys.executable, str(CHECK), *arguments],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    report = json.loads((out / "gpu-check.json").read_text())
    return done, report, (out / "gpu-check.md").read_text(), out


@pytest.mark.slow
def test_the_gpu_check_builds_its_venv_and_runs_every_step(tmp_path):
    done, report, markdown, out = _check(tmp_path, "--rehearse", "--venv", str(tmp_path / "v"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert report["build"]["outcome"] == "ok", report["build"]
    assert [s["what"] for s in report["build"]["steps"]][0] == "uv, into a folder"
    assert list(report["steps"]) == STEPS
    assert {name: r["outcome"] for name, r in report["steps"].items()} == dict.fromkeys(STEPS, "ok")
    mirrored = report["steps"]["mirrored_two_logical_gpus"]
    assert mirrored["replicas"] == 2 and mirrored["max_weight_difference"] < 1e-4
    workers = report["steps"]["multi_worker_two_processes"]["workers"]
    assert [
        (w["cuda_visible_devices"], w["memory_growth"], w["communication"]) for w in workers
    ] == [("0", "true", "ring")] * 2
    assert report["steps"]["mixed_float16_fit"]["optimizer"] == "LossScaleOptimizer"
    assert report["steps"]["fit_against_custom_loop"]["ratio_fit_to_loop"] > 0
    assert report["steps"]["one_device_fit_tf_keras"]["versions"]["keras_flavour"] == "tf_keras"
    for name in STEPS:
        assert f"| {name} | ok |" in markdown
        assert (out / "logs" / f"{name}.log").is_file()
    assert f"{len(STEPS)} of {len(STEPS)} steps passed" in done.stdout


@pytest.mark.slow
def test_on_a_host_where_tensorflow_sees_no_gpu_each_step_fails_on_its_own(tmp_path):
    steps = "devices,one_device_fit,multi_worker_two_processes"
    done, report, markdown, _ = _check(
        tmp_path, "--python", sys.executable, "--only", steps, "--budget", "200"
    )
    assert done.returncode == 1
    for name in steps.split(","):
        assert report["steps"][name]["outcome"] == "failed"
        assert "TensorFlow sees no GPU" in report["steps"][name]["error"], report["steps"][name]
    assert "passed: 0 of 3 steps" in markdown
