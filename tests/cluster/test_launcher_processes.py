"""tfdist launch with real processes (plain Python, no TensorFlow) for the supervision
rules: prefixed output, first failure stops all, timeouts, signals, restarts."""

import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tfdist.launcher import JobFailed, launch, plan_job, run_job
from tfdist.launcher.outcome import KEPT_LINE_CHARS, KEPT_LINES
from tfdist.testing import is_running

from helpers.launcher import _script


def test_output_is_prefixed_whole_lines_and_logged(tmp_path):
    script = _script(
        tmp_path,
        """
        import os, sys, time
        task = os.environ["TFDIST_TASK"]
        for i in range(50):
            sys.stdout.write(f"part-{task}-")   # a partial line, flushed ...
            sys.stdout.flush()
            time.sleep(0.001)
            sys.stdout.write(f"{i}\\n")         # ... completed later
            sys.stdout.flush()
        print("to stderr", file=sys.stderr)
    """,
    )
    out = io.StringIO()
    codes = launch(script, workers=2, out=out, log_dir=str(tmp_path / "logs"))
    assert codes == {"worker:0": 0, "worker:1": 0}
    lines = out.getvalue().splitlines()
    assert [line.split()[:4] for line in lines[-2:]] == [
        ["[tfdist]", "worker:0", "exit", "0"],
        ["[tfdist]", "worker:1", "exit", "0"],
    ]
    for task in ("worker:0", "worker:1"):
        mine = [line for line in lines if line.startswith(f"[{task}] ")]
        assert mine[:50] == [f"[{task}] part-{task}-{i}" for i in range(50)]
        assert f"[{task}] to stderr" in mine
        log = (tmp_path / "logs" / f"{task.replace(':', '-')}.log").read_text().splitlines()
        assert log[:50] == [f"part-{task}-{i}" for i in range(50)]


def test_first_failure_stops_every_task_and_names_the_task(tmp_path):
    script = _script(
        tmp_path,
        """
        import os, sys, time
        if os.environ["TFDIST_TASK"] == "worker:1":
            print("loading data"); print("something broke")
            sys.exit(3)
        time.sleep(120)
    """,
    )
    out = io.StringIO()
    started = time.monotonic()
    codes = launch(script, workers=2, out=out)
    assert time.monotonic() - started < 30
    assert codes["worker:1"] == 3
    assert codes["worker:0"] == -signal.SIGTERM
    assert (
        "[tfdist] Task worker:1 exited with code 3; the other tasks were stopped. "
        "Its last lines:\nloading data\nsomething broke" in out.getvalue()
    )
    with pytest.raises(JobFailed, match="Task worker:1 exited with code 3"):
        launch(script, workers=2, out=io.StringIO(), check=True)


def test_a_task_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    script = _script(
        tmp_path,
        """
        import os, signal, sys, time
        if os.environ["TFDIST_TASK"] == "worker:1":
            time.sleep(0.5); sys.exit(1)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ignoring SIGTERM", flush=True)
        time.sleep(120)
    """,
    )
    started = time.monotonic()
    result = run_job(plan_job(script, workers=2), grace=2.0, quiet=True)
    assert time.monotonic() - started < 30
    assert result.reason == "failed"
    assert result.tasks["worker:0"].returncode == -signal.SIGKILL
    assert result.tasks["worker:0"].stopped


def test_timeout_stops_the_job(tmp_path):
    script = _script(tmp_path, "import time; time.sleep(120)\n")
    out = io.StringIO()
    started = time.monotonic()
    codes = launch(script, workers=2, timeout=2, out=out)
    assert time.monotonic() - started < 20
    assert set(codes.values()) == {-signal.SIGTERM}
    assert "did not finish within --timeout 2 s" in out.getvalue()


def test_restarts_run_the_whole_job_again_on_fresh_ports(tmp_path):
    script = _script(
        tmp_path,
        f"""
        import json, os, sys
        task = os.environ["TFDIST_TASK"]
        with open(os.path.join({str(tmp_path)!r}, "configs.txt"), "a") as f:
            f.write(os.environ["TF_CONFIG"] + "\\n")
        marker = os.path.join({str(tmp_path)!r}, "failed-once")
        if task == "worker:1" and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), 9)
    """,
    )
    out = io.StringIO()
    codes = launch(script, workers=2, max_restarts=1, out=out)
    assert codes == {"worker:0": 0, "worker:1": 0}
    assert "Task worker:1 was killed by signal 9" in out.getvalue()
    assert "Restarting the job (1/1) on fresh ports" in out.getvalue()
    configs = [json.loads(line) for line in (tmp_path / "configs.txt").read_text().splitlines()]
    attempts = {tuple(c["cluster"]["worker"]) for c in configs}
    assert len(attempts) == 2
    first, second = attempts
    assert not set(first) & set(second)
    os.remove(tmp_path / "failed-once")
    assert launch(script, workers=2, max_restarts=0, out=io.StringIO())["worker:1"] == -9


def test_a_task_that_would_fail_the_same_way_again_is_not_restarted(tmp_path):
    script = _script(
        tmp_path,
        f"""
        import os, sys, time
        from tfdist import training_report
        runs = os.path.join({str(tmp_path)!r}, "runs.txt")
        with open(runs, "a") as f:
            f.write(os.environ["TFDIST_TASK"] + "\\n")
        if os.environ["TFDIST_TASK"] == "worker:1":
            while "worker:0" not in open(runs).read():  # both ran (the launcher then stops 0)
                time.sleep(0.05)
            print("ValueError: The backup ... does not fit this model")
            training_report.refuse_restart("the backup in /shared/backup was refused")
            sys.exit(1)
    """,
    )
    out = io.StringIO()
    codes = launch(script, workers=2, max_restarts=3, out=out)
    assert codes["worker:1"] == 1
    assert sorted((tmp_path / "runs.txt").read_text().split()) == ["worker:0", "worker:1"]
    text = out.getvalue()
    assert "Restarting" not in text, text
    assert (
        "The job is not restarted: worker:1 would fail the same way again (the backup in "
        "/shared/backup was refused)" in text
    ), text


def test_sigterm_to_the_launcher_leaves_no_orphans(tmp_path):
    script = _script(
        tmp_path,
        f"""
        import os, subprocess, sys, time
        task = os.environ["TFDIST_TASK"].replace(":", "-")
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        with open(os.path.join({str(tmp_path)!r}, task + ".pids"), "w") as f:
            f.write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(120)
    """,
    )
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tfdist", "launch", "--workers", "2", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("*.pids"))) < 2:
        assert time.monotonic() < deadline, "the tasks did not start"
        time.sleep(0.1)
    time.sleep(0.3)
    pids = [int(p) for f in tmp_path.glob("*.pids") for p in f.read_text().split()]
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=30) == 128 + signal.SIGTERM  # and the tasks did not save:
    assert (
        b"The job was interrupted (SIGTERM to the launcher); every task was stopped, and not "
        b"every task saved: worker:0 was killed by signal 15, worker:1 was killed by signal 15."
        in launcher.stdout.read()
    )
    assert len(pids) == 4
    assert not [pid for pid in pids if is_running(pid)]  # neither the tasks nor what they started


# A task that starts a process in a session of its own which ignores SIGTERM: outside the
# task's process group, it escapes the launcher's signals to the group.
_ESCAPING = """
    import os, subprocess, sys, time
    from tfdist import scratch
    with open(os.path.join(scratch.make_dir("tfdist-backup-"), "ckpt.index"), "w") as f:
        f.write("a save cut short")
    pids = os.path.join({folder!r}, os.environ["TFDIST_TASK"].replace(":", "-") + ".pids")
    code = (
        "import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "open(sys.argv[1], 'w').write(f'{{os.getppid()}} {{os.getpid()}}'); time.sleep(300)"
    )
    subprocess.Popen([sys.executable, "-c", code, pids + ".part"], start_new_session=True)
    while not os.path.exists(pids + ".part"):
        time.sleep(0.05)
    time.sleep(0.1)
    os.rename(pids + ".part", pids)
    time.sleep({sleep})
"""


def _pids(folder, tasks=2, timeout=30):
    deadline = time.monotonic() + timeout
    while len(list(folder.glob("*.pids"))) < tasks:
        assert time.monotonic() < deadline, "the tasks did not start"
        time.sleep(0.1)
    time.sleep(0.3)
    return [int(p) for f in folder.glob("*.pids") for p in f.read_text().split()]


def _gone(pids, within):
    deadline = time.monotonic() + within
    while [pid for pid in pids if is_running(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if is_running(pid)]


def test_kill_9_of_the_launcher_ends_its_tasks_and_all_they_started(tmp_path):
    script = _script(tmp_path, _ESCAPING.format(folder=str(tmp_path), sleep=120))
    reports = tempfile.mkdtemp(prefix="pytest-kill9-")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tfdist", "launch", "--workers", "2", "--grace", "2", script],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, TMPDIR=reports),  # where the launcher makes its report folder
    )
    pids = _pids(tmp_path)
    assert len(pids) == 4 and _gone(pids, within=0) == pids
    launcher.kill()
    launcher.wait(timeout=10)
    # The tasks get SIGTERM at once, what ignores it SIGKILL after --grace 2.
    assert not _gone(pids, within=15), "processes of the job outlived its launcher"
    deadline = time.monotonic() + 10  # the keepers remove them once their tasks have ended
    while os.listdir(reports) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert os.listdir(reports) == []  # nor its report folder, nor the tasks' scratch files
    os.rmdir(reports)


def test_what_a_task_started_in_a_session_of_its_own_ends_with_the_task(tmp_path):
    script = _script(tmp_path, _ESCAPING.format(folder=str(tmp_path), sleep=0))
    started = time.monotonic()
    result = run_job(plan_job(script, workers=2), quiet=True)
    assert result.reason == "done", result
    pids = _pids(tmp_path, timeout=0)
    assert not _gone(pids, within=0)  # SIGKILL after 5 s to what ignores the SIGTERM
    assert 4 < time.monotonic() - started < 30


def test_the_scratch_files_of_a_task_killed_mid_save_are_removed(tmp_path, monkeypatch):
    script = _script(
        tmp_path,
        f"""
        import os, signal, time
        from tfdist import scratch
        task = os.environ["TFDIST_TASK"]
        directory = scratch.make_dir("tfdist-backup-")
        with open(os.path.join(directory, "ckpt.data-00000-of-00001"), "w") as f:
            f.write("half a checkpoint")
        with open(os.path.join({str(tmp_path)!r}, task.replace(":", "-") + ".dir"), "w") as f:
            f.write(directory)
        if task == "worker:1":
            # once worker 0 has its scratch file too (the launcher then stops it)
            while not os.path.exists(os.path.join({str(tmp_path)!r}, "worker-0.dir")):
                time.sleep(0.05)
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer would
        time.sleep(120)
    """,
    )
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # the tasks' (and their keepers') TMPDIR
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # the launcher's own
    result = run_job(plan_job(script, workers=2), quiet=True)
    assert result.tasks["worker:1"].returncode == -signal.SIGKILL
    written = [f.read_text() for f in tmp_path.glob("*.dir")]
    assert len(written) == 2 and all(d.startswith(str(temp)) for d in written), written
    assert not [d for d in written if os.path.exists(d)]
    assert os.listdir(temp) == []


def test_a_task_keeps_its_exit_status_and_signal_under_its_keeper(tmp_path):
    # worker:1 crashes only once worker:0 can answer the launcher's stop with exit
    # status 7: whichever task ended first, each keeps its own status.
    ready = tmp_path / "worker0.ready"
    script = _script(
        tmp_path,
        f"""
        import os, signal, sys, time
        ready = {str(ready)!r}
        if os.environ["TFDIST_TASK"] == "worker:1":
            while not os.path.exists(ready):
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGSEGV)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
        open(ready, "w").close()
        time.sleep(120)
    """,
    )
    result = run_job(plan_job(script, workers=2), quiet=True)
    assert result.tasks["worker:1"].returncode == -signal.SIGSEGV
    assert result.tasks["worker:0"].returncode == 7


@pytest.mark.slow
def test_parameter_server_job_servers_stop_when_the_chief_is_done(tmp_path):
    script = _script(
        tmp_path,
        """
        import json, os
        config = json.loads(os.environ["TF_CONFIG"])
        print("chief runs the script as", config["task"])
    """,
    )
    out = io.StringIO()
    codes = launch(script, workers=1, ps=1, out=out, timeout=120)
    assert codes == {"chief:0": 0, "worker:0": 0, "ps:0": 0}
    text = out.getvalue()
    assert "[tfdist] ps:0       served until the job ended" in text
    assert "[chief:0] chief runs the script as {'type': 'chief', 'index': 0}" in text
    assert "[worker:0] chief runs" not in text and "[ps:0] chief runs" not in text


def test_the_launcher_keeps_the_last_lines_of_a_task_and_the_log_keeps_all(tmp_path):
    script = _script(
        tmp_path,
        f"""
        import sys
        for i in range({KEPT_LINES} + 500):
            print(f"line {{i}}")
        print("x" * ({KEPT_LINE_CHARS} + 10))
        sys.exit(3)
    """,
    )
    result = run_job(plan_job(script, workers=1), quiet=True, log_dir=str(tmp_path / "logs"))
    kept = result.tasks["worker:0"].output
    assert len(kept) == KEPT_LINES
    assert kept[0] == "line 501" and kept[-2] == f"line {KEPT_LINES + 499}"
    assert kept[-1].endswith(f" ... ({KEPT_LINE_CHARS + 10} characters in all)")
    assert len(kept[-1]) < KEPT_LINE_CHARS + 40
    log = (tmp_path / "logs" / "worker-0.log").read_text().splitlines()
    assert log[0] == "line 0" and log[-1] == "x" * (KEPT_LINE_CHARS + 10)


def test_the_summary_json_has_each_task_and_the_restarts(tmp_path):
    script = _script(
        tmp_path,
        f"""
        import os, sys
        marker = os.path.join({str(tmp_path)!r}, "failed-once")
        if os.environ["TFDIST_TASK"] == "worker:1" and not os.path.exists(marker):
            open(marker, "w").close()
            sys.exit(3)
    """,
    )
    path = tmp_path / "summary.json"
    code = subprocess.run(
        [sys.executable, "-m", "tfdist", "launch", "--workers", "2", "--max-restarts", "1",
         "--summary-json", str(path), script],
        capture_output=True, text=True, timeout=60,
    ).returncode  # fmt: skip
    summary = json.loads(path.read_text())
    assert code == 0 and summary["exit_code"] == 0 and summary["reason"] == "done", summary
    assert summary["restarts"] == 1 and summary["preemption_restarts"] == 0, summary
    assert set(summary["tasks"]) == {"worker:0", "worker:1"}
    for task in summary["tasks"].values():
        assert task["exit_code"] == 0 and task["seconds"] > 0 and task["steps"] is None, task
        assert task["restarts"] == 1, task  # each task of the job ran once before
    refused = subprocess.run(
        [sys.executable, "-m", "tfdist", "launch", "--summary-json",
         str(tmp_path / "no" / "such" / "s.json"), script],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2 and "does not exist. HINT" in refused.stderr, refused.stderr
