"""The launcher's progress line and stall detection (tfdist.launcher.progress), read from report
files written here as a task writes them; no process is started. Real jobs:
tests/cluster/test_stalled_job.py and tests/cluster/test_tensorboard_jobs.py."""

import io
import json
import os
import threading
import time
import types

import pytest

from tfdist.cli import main
from tfdist.launcher.progress import SEEN_LATE, Console, Monitor
from tfdist.training_report import STACKS_SUFFIX, read_progress


class _Job:
    """Fake tasks whose report files the test writes, and the monitor that reads them."""

    def __init__(
        self,
        tmp_path,
        names=("worker:0", "worker:1"),
        stall=4.0,
        every=2.0,
        live=False,
        log=None,
        servers=(),
        per_task=False,
    ):
        self.tasks = {
            name: types.SimpleNamespace(
                plan=types.SimpleNamespace(task=name, serves=name in servers),
                report=str(tmp_path / f"{name.replace(':', '-')}.json"),
                ended=None,
            )
            for name in (*names, *servers)
        }
        self.out = io.StringIO()
        self.console = Console(self.out, threading.Lock(), live=live, log=log)
        self.monitor = Monitor(
            list(self.tasks.values()), self.console, stall, every, now=0.0, per_task=per_task
        )

    def report(self, name, step, total=100, fitting=True):
        with open(self.tasks[name].report, "w") as f:
            json.dump({"fits": 0, "progress": dict(step=step, total=total, fitting=fitting)}, f)

    def at(self, now, **steps):
        for name, step in steps.items():
            self.report(name.replace("_", ":"), step)
        self.monitor.poll(now)

    def lines(self, start="[tfdist]"):
        return [line for line in self.out.getvalue().splitlines() if line.startswith(start)]

    def asked_for_stacks(self):
        return sorted(n for n, t in self.tasks.items() if os.path.exists(t.report + STACKS_SUFFIX))


def test_the_progress_line_shows_the_slowest_task_and_the_steps_per_second(tmp_path):
    job = _Job(tmp_path)
    job.at(1.0, worker_0=10, worker_1=12)  # one line every 2 s: the first after 2 s
    job.at(2.0, worker_0=15, worker_1=17)
    job.at(3.0, worker_0=20, worker_1=22)
    assert job.lines() == [
        "[tfdist] step 15/100, 5.0 steps/s, slowest worker:0 (the others at worker:1 17)",
    ]
    job.at(4.0, worker_0=30, worker_1=30)
    assert job.lines()[-1] == "[tfdist] step 30/100, 6.7 steps/s"


def test_with_verbose_the_line_shows_every_tasks_step_and_steps_per_second(tmp_path):
    job = _Job(tmp_path, per_task=True)
    job.at(1.0, worker_0=10, worker_1=10)
    job.at(2.0, worker_0=15, worker_1=14)
    job.at(3.0, worker_0=20, worker_1=20)
    assert job.lines() == [
        "[tfdist] step 14/100, 4.0 steps/s; worker:0 15 5.0/s, worker:1 14 4.0/s",
    ]
    job.at(4.0, worker_0=30, worker_1=30)
    assert (
        job.lines()[-1] == "[tfdist] step 30/100, 6.7 steps/s; worker:0 30 6.7/s, worker:1 30 6.7/s"
    )


def test_a_job_whose_steps_stop_is_reported_once_with_every_tasks_stacks_asked(tmp_path):
    job = _Job(tmp_path, every=0)
    job.at(1.0, worker_0=7, worker_1=7)
    job.at(4.5, worker_0=7, worker_1=7)
    assert job.lines() == [] and job.asked_for_stacks() == []
    job.at(5.5, worker_0=7, worker_1=7)
    (stall,) = job.lines()
    assert stall.startswith(
        "[tfdist] Stall: No task has made a training step for 4 s: worker:0 at step 7, "
        "worker:1 at step 7. The job goes on; the Python stacks of every task follow."
    )
    assert "HINT" in stall and "--stall-timeout 0" in stall
    assert job.asked_for_stacks() == ["worker:0", "worker:1"]
    job.at(30.0, worker_0=7, worker_1=7)
    assert len(job.lines()) == 1  # once per stall
    job.at(31.0, worker_0=8, worker_1=8)  # it went on: the next stall is reported again
    job.at(35.5, worker_0=8, worker_1=8)
    assert len(job.lines()) == 2 and "at step 8" in job.lines()[-1]


def test_the_launchers_own_lines_are_kept_in_its_log(tmp_path):
    log = tmp_path / "logs" / "launcher.log"
    log.parent.mkdir()
    job = _Job(tmp_path, log=str(log))
    job.console.line("[worker:0] a task's line: its own log has it")
    for now in range(1, 8):
        job.at(float(now), worker_0=10, worker_1=10 if now > 1 else 9)
    kept = log.read_text().splitlines()
    assert kept == job.lines(), (kept, job.lines())  # the progress lines and the stall
    assert any(line.startswith("[tfdist] Stall: ") for line in kept), kept
    assert not any(line.startswith("[worker:0]") for line in kept), kept


def test_at_a_stall_the_servers_of_a_parameter_server_job_are_asked_for_their_stacks_too(
    tmp_path,
):
    job = _Job(tmp_path, names=("chief:0",), servers=("worker:0", "ps:0"))
    for now in range(1, 7):
        job.at(float(now), chief_0=3)
    assert any(line.startswith("[tfdist] Stall: ") for line in job.lines()), job.lines()
    assert job.asked_for_stacks() == ["chief:0", "ps:0", "worker:0"]


def test_a_server_answers_the_launchers_request_for_its_stacks(tmp_path, monkeypatch, capfd):
    from tfdist import training_report

    report = tmp_path / "ps-0.json"
    monkeypatch.setenv("TFDIST_REPORT_FILE", str(report))
    monkeypatch.setenv("TFDIST_STALL_TIMEOUT", "0")
    assert not training_report.answer_stack_requests()  # the launcher watches no stall
    monkeypatch.setenv("TFDIST_STALL_TIMEOUT", "5")
    assert training_report.answer_stack_requests()
    training_report.request_stacks(str(report))
    deadline = time.monotonic() + 10
    while os.path.exists(str(report) + STACKS_SUFFIX) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    err = capfd.readouterr().err
    assert "tfdist: the stack of every thread of this task (asked by the launcher):" in err, err
    assert " in answer" in err, err  # faulthandler's stacks, the answering thread's among them


def test_a_task_left_behind_is_named_with_the_steps_of_the_others(tmp_path):
    job = _Job(tmp_path, every=0)
    job.at(1.0, worker_0=3, worker_1=3)
    for second in range(2, 6):
        job.at(float(second), worker_0=3 + second, worker_1=3)
    (stall,) = job.lines()
    assert stall.startswith(
        "[tfdist] Stall: worker:1 at step 3 made no training step for 4 s, while worker:0 at "
        "step 8."
    ), stall


def test_tasks_seen_to_stop_about_together_are_named_together(tmp_path):
    # worker:1 is held up at step 7; worker:0's last step reaches the launcher one read later
    # (its report is up to a second late) before it waits for worker:1 in the collective
    job = _Job(tmp_path, every=0)
    job.at(1.0, worker_0=6, worker_1=7)
    job.at(2.0, worker_0=8, worker_1=7)
    job.at(4.0, worker_0=8, worker_1=7)
    assert job.lines() == []
    job.at(5.0, worker_0=8, worker_1=7)  # worker:1 still 4 s, worker:0 3 s: both stopped
    (stall,) = job.lines()
    assert stall.startswith(
        "[tfdist] Stall: No task has made a training step for 4 s: worker:0 at step 8, "
        "worker:1 at step 7."
    ), stall


def test_the_docs_give_the_time_within_which_stopped_tasks_are_named_together():
    from helpers.docs import DOCS, prose

    page = prose(DOCS / "debugging.md")
    assert f"within {SEEN_LATE:g} s of one another (`tfdist.launcher.progress.SEEN_LATE`" in page


def test_a_task_between_two_fits_or_before_its_first_is_never_stalled(tmp_path):
    job = _Job(tmp_path, every=0)
    job.report("worker:0", None, fitting=False)  # loading its data
    job.report("worker:1", 40, fitting=False)  # saving, after a fit
    for second in range(1, 30):
        job.monitor.poll(float(second))
    assert job.lines() == []
    job.report("worker:0", 40)  # a new fit: its clock starts now
    job.report("worker:1", 40)
    job.monitor.poll(30.0)
    job.monitor.poll(33.0)
    assert job.lines() == []
    job.monitor.poll(34.0)
    assert len(job.lines()) == 1


def test_off_switches(tmp_path):
    job = _Job(tmp_path, stall=0, every=0)
    for second in range(1, 20):
        job.at(float(second), worker_0=1, worker_1=1)
    assert job.out.getvalue() == ""


def test_on_a_terminal_the_status_line_stays_below_the_tasks_lines(tmp_path):
    job = _Job(tmp_path, live=True)
    job.at(1.0, worker_0=10, worker_1=10)
    job.console.line("[worker:0] epoch 1")
    job.console.clear()
    assert job.out.getvalue() == (
        "\r\x1b[K[tfdist] step 10/100"  # the status line
        "\r\x1b[K[worker:0] epoch 1\n[tfdist] step 10/100"  # erased, the line, drawn again
        "\r\x1b[K"  # erased at the end of the job
    )


def test_a_report_that_cannot_be_read_is_no_progress(tmp_path):
    path = tmp_path / "report.json"
    assert read_progress(str(path)) is None
    path.write_text("{not json")
    assert read_progress(str(path)) is None
    path.write_text(json.dumps({"fits": 1, "progress": "soon"}))
    assert read_progress(str(path)) is None


@pytest.mark.parametrize("value", ["-1", "soon", "inf"])
def test_a_stall_timeout_that_is_no_number_of_seconds_is_refused(value, capsys):
    with pytest.raises(SystemExit):
        main(["launch", "--stall-timeout", value, "--workers", "1", "train.py"])
    err = capsys.readouterr().err
    assert f"--stall-timeout must be a number of seconds >= 0, not {value!r}" in err
    assert "HINT" in err


class _Model:
    """A model whose optimizer is at `step`, as training_report reads it."""

    def __init__(self, step):
        self.optimizer = types.SimpleNamespace(iterations=types.SimpleNamespace(numpy=lambda: step))


def test_without_the_launcher_a_stalled_task_prints_its_own_stacks_once(capfd, monkeypatch):
    from tfdist import training_report

    clock = [100.0]
    monkeypatch.setattr(training_report.time, "monotonic", lambda: clock[0])
    reporter = training_report._Reporter(None, stall_timeout=60, task="worker:1")
    model = _Model(13)
    reporter.begin(types.SimpleNamespace(model=model, params={"epochs": 1, "steps": 30}))
    reporter.report()
    clock[0] = 159.0
    reporter.report()
    reporter.watch()
    assert capfd.readouterr().err == ""
    clock[0] = 161.0
    reporter.report()
    reporter.watch()
    reporter.watch()  # once per stall
    err = capfd.readouterr().err
    assert err.count("tfdist: worker:1 has made no training step for 61 s (at step 13)") == 1
    assert "most recent call first" in err and "test_launcher_progress.py" in err, err
    model.optimizer.iterations.numpy = lambda: 14  # it moved: the next stall is told again
    reporter.report()
    clock[0] = 222.0
    reporter.report()
    reporter.watch()
    assert "for 61 s (at step 14)" in capfd.readouterr().err
