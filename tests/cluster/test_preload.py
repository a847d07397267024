"""tfdist.launcher.preload: tasks forked from a process that imported TensorFlow once behave as
fresh processes would (arguments, environment, working directory, path, exit codes, signals),
and none outlives its client or its preloader. One preloader serves the whole module."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tfdist import netns
from tfdist.launcher import preload
from tfdist.testing import is_running, run_cluster

pytestmark = pytest.mark.skipif(not preload.available(), reason="forking tasks needs Linux")

TASK = """
import json, os, random, signal, sys, time
import numpy as np
mode = sys.argv[1]
if mode == "report":
    print(json.dumps({
        "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "pid": os.getpid(),
        "extra": os.environ.get("TFDIST_TEST_EXTRA"), "config": os.environ.get("TF_CONFIG"),
        "preloaded": "tensorflow" in sys.modules, "name": __name__,
        "draws": [random.random(), float(np.random.rand())],
        "helper": __import__("preload_helper").VALUE,
    }), flush=True)
    sys.exit(7)
if mode == "raise":
    raise ValueError("a task that fails")
if mode == "term":
    def on_term(signum, frame):
        print("got SIGTERM", flush=True)
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
if mode in ("term", "hang"):
    with open(sys.argv[2], "w") as f:
        f.write(str(os.getpid()))
    print("waiting", flush=True)
    time.sleep(120)
"""


@pytest.fixture(scope="module")
def preloader():
    started = preload.Preloader(os.environ)
    yield started
    started.close()


@pytest.fixture()
def task(tmp_path):
    (tmp_path / "task.py").write_text(TASK)
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "preload_helper.py").write_text("VALUE = 'from the task path'\n")
    env = dict(os.environ, PYTHONPATH=str(lib), TFDIST_TEST_EXTRA="x", TF_CONFIG='{"a": 1}')
    return tmp_path, env


def _run(preloader, argv, env, cwd, timeout=60):
    return subprocess.run(
        preloader.wrap(argv), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def _start(preloader, folder, env, mode, pid_file, **popen):
    """A task in `mode` ("term" or "hang") that writes its pid to `pid_file`: (client, pid)."""
    proc = subprocess.Popen(
        preloader.wrap([sys.executable, str(folder / "task.py"), mode, str(pid_file)]),
        env=env,
        cwd=folder,
        **popen,
    )
    return proc, _wait_for_file(pid_file)


def _wait_for_file(path, limit=60.0):
    end = time.monotonic() + limit
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < end, f"{path} was never written"
        time.sleep(0.05)
    return int(path.read_text())


def test_a_task_gets_its_arguments_environment_directory_and_path(preloader, task):
    import json

    folder, env = task
    work = folder / "work"
    work.mkdir()
    runs = [
        _run(preloader, [sys.executable, str(folder / "task.py"), "report", "b"], env, work)
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 7, run.stdout + run.stderr
    first, second = (json.loads(run.stdout.splitlines()[-1]) for run in runs)
    assert first["argv"] == [str(folder / "task.py"), "report", "b"]
    assert first["cwd"] == str(work) and first["path0"] == str(folder)
    assert first["extra"] == "x" and first["config"] == '{"a": 1}'
    assert first["name"] == "__main__" and first["helper"] == "from the task path"
    assert first["preloaded"]  # imported once, by the preloader
    assert first["pid"] != second["pid"]
    assert first["draws"][0] != second["draws"][0]  # random, reseeded in every task
    assert first["draws"][1] != second["draws"][1]  # numpy's too


def test_a_module_runs_as_with_python_m(preloader, tmp_path):
    (tmp_path / "as_module.py").write_text(
        "import sys\nprint(__name__, sys.argv[1:], sys.argv[0].endswith('as_module.py'))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    run = _run(preloader, [sys.executable, "-m", "as_module", "x"], env, tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "__main__ ['x'] True"


def test_an_exception_is_exit_code_one_with_its_traceback(preloader, task):
    folder, env = task
    run = _run(preloader, [sys.executable, str(folder / "task.py"), "raise"], env, folder)
    assert run.returncode == 1
    assert "ValueError: a task that fails" in run.stderr


def test_the_client_passes_signals_on(preloader, task):
    folder, env = task
    proc, _ = _start(preloader, folder, env, "term", folder / "term.pid", stdout=subprocess.PIPE)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 143 and "got SIGTERM" in out


def test_a_task_killed_by_a_signal_is_reported_so(preloader, task):
    folder, env = task
    proc, pid = _start(preloader, folder, env, "hang", folder / "hang.pid")
    os.kill(pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def test_no_task_outlives_its_client_killed_by_sigkill(preloader, task):
    folder, env = task
    proc, pid = _start(preloader, folder, env, "hang", folder / "orphan.pid")
    proc.kill()
    proc.wait()
    _assert_ends(pid, "its client")


def test_no_task_outlives_its_preloader(task):
    folder, env = task
    own = preload.Preloader(os.environ)
    proc, pid = _start(own, folder, env, "hang", folder / "left.pid", stderr=subprocess.PIPE)
    os.killpg(own.proc.pid, signal.SIGKILL)  # the preloader dies, not gracefully
    own.close()
    _assert_ends(pid, "its preloader")
    assert proc.wait(timeout=10) != 0


def _assert_ends(pid, what, limit=10.0):
    end = time.monotonic() + limit
    while is_running(pid):
        assert time.monotonic() < end, f"the task outlived {what} by {limit:g} s"
        time.sleep(0.05)


def report_task():
    import os
    import sys

    return {
        "isolated": netns.is_isolated(),
        "preloaded": os.environ.get("TFDIST_PRELOAD") != "0" and "tensorflow" in sys.modules,
        "legacy": os.environ.get("TF_USE_LEGACY_KERAS"),
    }


def _namespaces_here() -> bool:
    try:
        netns.create().close()
    except netns.Unavailable:
        return False
    return True


def test_run_cluster_forks_its_tasks_into_the_jobs_namespace():
    runs = run_cluster(report_task, workers=2, timeout=120)
    isolated = _namespaces_here()
    for run in runs.values():
        assert run.value["preloaded"]
        assert run.value["isolated"] == isolated  # loopback only, as a fresh task would be
    # an environment TensorFlow reads at import gets a preloader of its own
    legacy = run_cluster(report_task, workers=1, env={"TF_USE_LEGACY_KERAS": "1"}, timeout=120)
    assert legacy["worker:0"].value["legacy"] == "1"
    keys = [dict(key) for key in preload._SHARED]
    assert any(k.get("TF_USE_LEGACY_KERAS") == "1" for k in keys)
    assert any("TF_USE_LEGACY_KERAS" not in k for k in keys)


def test_tfdist_preload_0_starts_fresh_processes():
    runs = run_cluster(report_task, workers=1, env={"TFDIST_PRELOAD": "0"}, timeout=120)
    assert runs["worker:0"].value["preloaded"] is False


def test_a_preloader_that_cannot_start_says_how_to_do_without(monkeypatch, tmp_path):
    # a TensorFlow that fails to import: a module of that name first on the preloader's path
    (tmp_path / "tensorflow.py").write_text("raise ImportError('no TensorFlow here')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="no TensorFlow here(.|\n)*TFDIST_PRELOAD=0"):
        preload.Preloader(os.environ, timeout=60)
