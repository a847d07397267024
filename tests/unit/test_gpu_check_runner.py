"""The prepared GPU check's own code (tests/gpu/gpu_check.py, tests/gpu/gpu_steps.py), without
TensorFlow or a GPU: a step's process group is stopped whole at its limit, what a step starts
is bounded within the step's limit, bfloat16 is skipped below compute capability 8.0 with the
reason, the memory read is of the GPU that CUDA_VISIBLE_DEVICES names, and the budget says
which steps it left out or cut. The whole check, rehearsed on CPUs:
tests/cluster/test_gpu_check_rehearsal.py.
"""

import importlib.util
import json
import os
import signal
import stat
import subprocess
import sys
import time
import types

import pytest

from helpers.paths import ROOT

GPU = ROOT / "tests" / "gpu"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", GPU / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _load("gpu_check")
steps = _load("gpu_steps")


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


GRANDCHILD = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (open(sys.argv[1], "w").close(), sys.exit(0)))
open(sys.argv[2], "w").close()
time.sleep(60)
"""
CHILD = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]])
while not os.path.exists(sys.argv[3]):
    time.sleep(0.05)
print("started", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_a_step_that_times_out_is_stopped_with_all_it_started(tmp_path, monkeypatch):
    """A `tfdist launch` in a step, say: it gets SIGTERM too (to stop its tasks), and the
    group's SIGKILL follows; nothing it started in its group outlives the step."""
    stopped, ready = tmp_path / "stopped", tmp_path / "ready"
    monkeypatch.setattr(check, "STOP_SECONDS", 3)
    command = [sys.executable, "-c", CHILD, GRANDCHILD, str(stopped), str(ready)]
    began = time.monotonic()
    code, output = check._run(command, timeout=3)
    took = time.monotonic() - began
    grandchildren = [
        int(pid)
        for pid in os.listdir("/proc")
        if pid.isdigit() and _cmdline(pid).endswith(f"{stopped}\0{ready}\0")
    ]
    try:
        assert code == "timeout" and "started" in output
        assert stopped.exists(), "the grandchild got no SIGTERM"
        assert not [pid for pid in grandchildren if _alive(pid)]
        assert took < 3 + 3 + check.DRAIN_SECONDS + 2
    finally:
        for pid in grandchildren:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read()
    except OSError:
        return ""


def test_a_command_that_ends_in_time_gives_its_exit_code_and_output():
    assert check._run([sys.executable, "-c", "print('hi'); raise SystemExit(3)"], 30) == (3, "hi\n")
    assert check._run(["/nonexistent/tool"], 30)[0] == "error"


@pytest.fixture
def started(monkeypatch):
    """What the step starts ({"timeout": ..., "command": ...}), none of it run."""
    calls = []

    def run(command, **kwargs):
        calls.append(dict(kwargs, command=command))
        return subprocess.CompletedProcess(command, 1, stdout="", stderr="")

    def nccl_run(arguments, timeout):
        calls.append({"command": ["nccl_check", *arguments], "timeout": timeout})
        return {"outcome": "ok"}

    monkeypatch.setattr(steps.subprocess, "run", run)
    monkeypatch.setattr(steps, "REHEARSE", True)  # no GPU asked for
    from tfdist.cli import nccl_check

    monkeypatch.setattr(nccl_check, "run", nccl_run)
    return calls


@pytest.mark.parametrize("step", ["multi_worker_two_processes", "one_device_fit_tf_keras",
                                  "nccl_two_logical_gpus"])  # fmt: skip
@pytest.mark.parametrize("cut", [None, 60], ids=["own limit", "cut by the budget to 60 s"])
def test_what_a_step_starts_ends_within_the_step_s_limit(step, cut, started):
    limit = check.STEPS[step][0] if cut is None else cut
    steps.start_clock(limit)
    try:
        steps.STEPS[step]()
    except AssertionError:
        pass  # the stand-ins give no result
    (call,) = started
    assert call["timeout"] <= limit - steps.REPORT_SECONDS
    command = call["command"]
    if "launch" in command:  # the job ends, its tasks stopped, before its process's timeout
        job = float(command[command.index("--timeout") + 1])
        grace = float(command[command.index("--grace") + 1])
        assert job + grace < call["timeout"]
    if call.get("env", {}).get(steps.LIMIT_VARIABLE):  # the child step's own limit, within
        assert float(call["env"][steps.LIMIT_VARIABLE]) < call["timeout"]


def test_a_step_with_too_little_of_its_limit_left_says_so(started):
    steps.start_clock(12)
    with pytest.raises(RuntimeError, match=r"s left of the step's limit: too few for"):
        steps.STEPS["multi_worker_two_processes"]()
    assert started == []


@pytest.mark.parametrize(
    "capability, reason",
    [
        ((7, 5), "needs compute capability 8.0, found 7.5"),
        ((6, 1), "needs compute capability 8.0, found 6.1"),
        (None, "needs compute capability 8.0, found none reported"),
        ((8, 0), None),
        ((9, 0), None),
    ],
)
def test_bfloat16_needs_compute_capability_8(capability, reason):
    assert steps.bf16_skip_reason(capability) == reason


def test_the_bfloat16_step_is_skipped_on_an_older_gpu_with_the_reason(monkeypatch, capsys):
    monkeypatch.setattr(steps, "REHEARSE", False)
    monkeypatch.setattr(steps, "_compute_capability", lambda: (7, 0))
    monkeypatch.setattr(steps, "_mixed", lambda *_: pytest.fail("bfloat16 ran on a 7.0 GPU"))
    assert steps.main(["mixed_bfloat16_fit"]) == 0
    result = steps.parse(capsys.readouterr().out)
    assert result["outcome"] == "skipped"
    assert result["reason"] == "needs compute capability 8.0, found 7.0"


def test_the_memory_read_is_of_the_gpu_cuda_visible_devices_names(tmp_path):
    tool = tmp_path / "nvidia-smi"  # GPU 0: 81920 MiB, GPU 1: 16384 MiB
    tool.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        '  "-i 1 "*|"-i GPU-1b2c "*) echo 16384;;\n'
        '  "-i 0 "*) echo 81920;;\n'
        '  "-i "*) echo "No devices were found" >&2; exit 6;;\n'
        "  *) printf '0, A100, 81920, 8.0\\n1, T4, 16384, 7.5\\n';;\n"
        "esac\n"
    )
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    path = str(tmp_path)
    assert steps._gpu_memory_mib({"PATH": path, "CUDA_VISIBLE_DEVICES": "1"}) == 16384
    assert steps._gpu_memory_mib({"PATH": path, "CUDA_VISIBLE_DEVICES": "GPU-1b2c,0"}) == 16384
    assert steps._gpu_memory_mib({"PATH": path}) == 81920  # unset: the first
    assert steps._gpu_memory_mib({"PATH": path, "CUDA_VISIBLE_DEVICES": "7"}) is None
    assert steps._gpu_memory_mib({"PATH": str(tmp_path / "nowhere")}) is None


def test_the_steps_run_on_the_gpu_nvidia_smi_numbers_so():
    env = check.step_environment({"TF_CONFIG": "{}", "PATH": "/bin"})
    assert env == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    theirs = check.step_environment(
        {"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    )
    assert theirs == {"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    assert check.step_environment({}, rehearse=True) == {"TFDIST_GPU_CHECK_REHEARSE": "1"}


def test_the_budget_says_which_steps_it_left_out_or_cut(tmp_path, monkeypatch, capsys):
    """Every step takes its whole limit here (a fake clock): the report names the steps the
    budget cut and those it did not run, and the check stays within the budget."""
    now = [0.0]
    monkeypatch.setattr(check, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(check, "host_facts", lambda: {"platform": "p", "cpu_count": 16,
                                                      "python": "3"})  # fmt: skip
    given = {}

    def run_step(name, python, logs, timeout, env=None):
        given[name] = timeout
        now[0] += timeout + check.STOP_SECONDS + check.DRAIN_SECONDS  # a step stopped late
        if name == "mixed_bfloat16_fit":
            return {"outcome": "skipped", "reason": "needs compute capability 8.0, found 7.5"}
        return {"outcome": "ok", "seconds": timeout}

    monkeypatch.setattr(check, "run_step", run_step)
    monkeypatch.setenv("OUT", str(tmp_path))
    code = check.main(["--python", sys.executable, "--budget", "480"])
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    markdown = (tmp_path / "gpu-check.md").read_text()
    ran, left_out = list(given), report["not_run_for_lack_of_time"]
    assert ran + left_out == list(check.STEPS) and left_out  # the limits exceed the budget
    assert now[0] <= 480
    assert [report["steps"][n]["outcome"] for n in left_out] == ["not run"] * len(left_out)
    assert report["limit_cut_by_budget"] == {
        n: given[n] for n in ran if given[n] < check.STEPS[n][0]
    }
    assert f"not run for lack of time (the 480 s budget ran out): {', '.join(left_out)}" in markdown
    assert "not run for lack of time" in capsys.readouterr().out
    skipped = "| mixed_bfloat16_fit | skipped |  | needs compute capability 8.0, found 7.5 |"
    assert skipped in markdown
    assert code == 1  # steps not run: not a pass
