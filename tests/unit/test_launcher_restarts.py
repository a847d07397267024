"""How the launcher reads the end of a job, without starting anything: preempted (exit code 143)
or failed, the launcher's own exit code, its messages, the worker slots of an elastic job, and
the checks of `--workers MIN:MAX` and `--grace`. Real processes:
tests/cluster/test_launcher_preemption.py."""

import dataclasses
import signal
import threading

import pytest

from tfdist.cli import main
from tfdist.launcher import job as job_module
from tfdist.launcher.job import check_grace
from tfdist.launcher.outcome import (
    JobResult,
    TaskResult,
    classify,
    exit_code,
    failure_message,
    summary,
)
from tfdist.launcher.restarts import _Slots, check_workers, launch
from tfdist.preemption import PREEMPTED_EXIT_CODE

from helpers.launcher import _script


def _result(reason, *tasks, **kwargs):
    return JobResult(reason, {t.task: t for t in tasks}, **kwargs)


def _task(name, code, seconds=1.0, **kwargs):
    return TaskResult(name, code, [f"{name} said goodbye"], seconds, **kwargs)


def test_the_launcher_reads_the_same_exit_code_as_the_preemption_package():
    assert PREEMPTED_EXIT_CODE == 143 == job_module.PREEMPTED_EXIT_CODE


@pytest.mark.parametrize(
    "codes, expected",
    [
        ((0, 0), "done"),
        ((143, 143), "preempted"),
        ((0, 143), "preempted"),  # one finished before it learnt of the preemption
        ((143, 1), "failed"),
        ((143, -15), "failed"),  # killed by the signal: it did not save
        ((143, -9), "failed"),
        ((0, 137), "failed"),  # a shell's "killed by SIGKILL" is a failure like any other
    ],
)
def test_a_job_is_preempted_when_each_script_task_exited_0_or_143(codes, expected):
    tasks = [_task(f"worker:{i}", code) for i, code in enumerate(codes)]
    assert classify(tasks) == expected


def test_servers_stopped_at_the_end_do_not_decide_how_the_job_went():
    tasks = [
        _task("chief:0", 143),
        _task("worker:0", -15, stopped=True, serves=True),
        _task("ps:0", -9, stopped=True, serves=True),
    ]
    result = _result(classify(tasks), *tasks)
    assert result.reason == "preempted" and result.saved
    assert result.returncodes == {"chief:0": 143, "worker:0": 0, "ps:0": 0}
    lines = summary(result).splitlines()
    assert lines[0].startswith("[tfdist] chief:0    preempted (143) ")
    assert lines[1].startswith("[tfdist] worker:0   served until the job ended ")


def test_the_summary_tells_preempted_tasks_from_stopped_ones():
    result = _result(
        "failed",
        _task("worker:0", 143, stopped=True),  # saved when the launcher stopped it
        _task("worker:1", 143),
        _task("worker:2", -15, stopped=True),
        _task("worker:3", 1),
    )
    hows = [line[19:47].strip() for line in summary(result).splitlines()]
    assert hows == ["preempted (143)", "preempted (143)", "stopped (-15)", "exit 1"]


@pytest.mark.parametrize(
    "codes, signum, expected",
    [
        ((143, 143), signal.SIGTERM, 143),  # saved: the scheduler should restart it
        ((143, 143), signal.SIGINT, 143),
        ((143, -15), signal.SIGTERM, 143),  # 128 + 15, but the message says it did not save
        ((-15, -15), signal.SIGINT, 130),
        ((0, 143), signal.SIGINT, 130),  # not every task saved
        ((0, 0), None, 0),
        ((0, 0), signal.SIGTERM, 0),  # done as the signal came: nothing is left to resume
        ((143, 143), None, 1),  # preempted, not restarted (MAX_PREEMPTION_RESTARTS)
        ((0, 1), None, 1),
    ],
)
def test_the_exit_code_of_tfdist_launch(codes, signum, expected):
    tasks = [_task(f"worker:{i}", code) for i, code in enumerate(codes)]
    reason = "interrupted" if signum and codes != (0, 0) else classify(tasks)
    assert exit_code(_result(reason, *tasks, launcher_signal=signum)) == expected


def test_the_message_after_the_launchers_own_signal_says_whether_the_tasks_saved():
    saved = _result(
        "interrupted",
        _task("worker:0", 143, stopped=True),
        _task("worker:1", 143, stopped=True),
        launcher_signal=signal.SIGTERM,
    )
    assert failure_message(saved, None) == (
        "The job was interrupted (SIGTERM to the launcher); every task saved and exited with "
        "code 143 (preempted): run the same command again to resume from the backup."
    )
    unsaved = _result(
        "interrupted",
        _task("worker:0", 143, stopped=True),
        _task("worker:1", -9, stopped=True),
        launcher_signal=signal.SIGINT,
    )
    assert failure_message(unsaved, None) == (
        "The job was interrupted (SIGINT to the launcher); every task was stopped, and not "
        "every task saved: worker:1 was killed by signal 9."
    )
    nothing = _result("interrupted", launcher_signal=signal.SIGTERM)
    assert failure_message(nothing, None).endswith("before any task started.")
    assert exit_code(nothing) == 128 + signal.SIGTERM


def test_the_messages_name_the_task_preempted_first_and_one_that_did_not_follow():
    preempted = _result(
        "preempted",
        _task("worker:0", 143, seconds=2.0),
        _task("worker:1", 143, seconds=1.0),
        _task("worker:2", 143, seconds=0.5, stopped=True),
    )
    assert failure_message(preempted, None) == (
        "The job was preempted (task worker:1 exited with code 143 first)."
    )
    late = _result(
        "failed",
        _task("worker:0", -15, seconds=12.0, stopped=True),
        _task("worker:1", 143, seconds=1.0),
    )
    assert failure_message(late, None, grace=10) == (
        "Task worker:0 was still running 10 s after task worker:1 exited with code 143 first "
        "(preempted), and did not save when it was stopped: it was killed by signal 15. Its "
        "last lines:\nworker:0 said goodbye"
    )
    failed = _result(
        "failed",
        _task("worker:0", 143, seconds=1.0),
        _task("worker:1", 1, seconds=1.5),
        _task("worker:2", -15, seconds=1.6, stopped=True),
    )
    assert failure_message(failed, None).startswith(
        "Task worker:1 exited with code 1; the other tasks were stopped."
    )


def test_an_elastic_job_counts_failures_per_slot_and_loses_a_slot_for_good():
    slots = _Slots(low=2, high=3, max_restarts=1)
    assert slots.workers == 3 and slots.slot("worker:2") == 2
    assert slots.failed("worker:2") == ("restart", 2, 1)
    assert slots.failed("worker:0") == ("restart", 0, 1)  # another slot: its own count
    assert slots.failed("worker:2") == ("shrink", 2, 2)  # more than max_restarts: lost
    assert slots.active == [0, 1] and slots.lost == [2]
    assert slots.failed("worker:1") == ("restart", 1, 1)
    assert slots.failed("worker:1") == ("fail", 1, 2)  # 1 worker would be fewer than MIN


def test_workers_are_renumbered_and_a_slot_that_comes_back_starts_afresh():
    slots = _Slots(low=1, high=3, max_restarts=0)
    assert slots.failed("worker:1") == ("shrink", 1, 1)
    assert slots.slot("worker:1") == 2  # worker:1 of the next attempt runs in slot 2
    assert slots.failed("worker:0") == ("shrink", 0, 1)
    assert slots.active == [2] and slots.lost == [1, 0]
    assert slots.grow(1) == [1]  # the slot lost first comes back first
    assert slots.active == [1, 2] and slots.slot("worker:0") == 1
    assert slots.grow(5) == [0] and slots.workers == 3 and slots.grow(1) == []
    assert slots.failed("worker:1") == ("shrink", 1, 1)  # its count started again


def test_a_chief_or_an_unknown_task_is_a_slot_that_cannot_be_lost():
    slots = _Slots(low=1, high=3, max_restarts=1)
    assert slots.failed("chief:0") == ("restart", "chief:0", 1)
    assert slots.failed("chief:0") == ("fail", "chief:0", 2)
    assert slots.failed(None) == ("restart", "the job", 1)
    assert slots.name(2) == "worker slot 2" and slots.name("chief:0") == "chief:0"


@pytest.mark.parametrize(
    "workers, ps, fragments",
    [
        ((3, 2), 0, ["workers=(3, 2)", "1 <= MIN <= MAX", "HINT: e.g. workers=(2, 3)"]),
        ((0, 2), 0, ["workers=(0, 2)", "HINT"]),
        ((1, 2, 3), 0, ["workers=(1, 2, 3)", "HINT"]),
        ((1.5, 2), 0, ["workers=(1.5, 2)", "HINT"]),
        ((True, 2), 0, ["workers=(True, 2)", "HINT"]),
        ("2:3", 0, ["workers='2:3'", "HINT: e.g. workers=2, workers=(2, 3)"]),
        ((2, 3), 1, ["workers=(2, 3)", "ps=1", "HINT: a parameter-server job already keeps"]),
    ],
)
def test_bad_worker_ranges_are_refused_with_the_value_and_the_fix(workers, ps, fragments):
    with pytest.raises(ValueError) as caught:
        check_workers(workers, ps)
    assert all(f in str(caught.value) for f in fragments), str(caught.value)


def test_worker_ranges_that_are_accepted():
    assert check_workers(3) == (3, 3)
    assert check_workers((2, 3)) == (2, 3) and check_workers([1, 1]) == (1, 1)
    assert check_workers(2, ps=1) == (2, 2)


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), "30", True, None])
def test_a_grace_that_is_not_a_positive_number_of_seconds_is_refused(value):
    with pytest.raises(ValueError, match=r"grace must be a positive.*Received: grace="):
        check_grace(value)
    assert check_grace(2) == 2.0


def test_launch_refuses_bad_settings_before_it_starts_anything(tmp_path):
    script = _script(tmp_path, "raise SystemExit('started')\n")
    with pytest.raises(ValueError, match=r"workers=\(3, 2\)"):
        launch(script, workers=(3, 2))
    with pytest.raises(ValueError, match="ps=1. HINT: a parameter-server job already keeps"):
        launch(script, workers=(1, 2), ps=1)
    with pytest.raises(ValueError, match="grace=0"):
        launch(script, grace=0)
    with pytest.raises(ValueError, match=r"grow= needs an elastic job. Received: workers=2"):
        launch(script, workers=2, grow=threading.Event())


@pytest.mark.parametrize(
    "value, message",
    [
        ("3:2", "argument --workers: '3:2': MIN 3 is more than MAX 2. HINT: --workers 2:3"),
        ("0:2", "argument --workers: '0:2': MIN must be at least 1, a job needs a worker. HINT"),
        ("a:b", "argument --workers: 'a:b' is neither a number of workers N nor a range MIN:MAX"),
        ("2:", "argument --workers: '2:' is neither a number of workers N nor a range"),
        ("two", "argument --workers: 'two' is neither"),
    ],
)
def test_cli_refuses_bad_worker_specs(tmp_path, capsys, value, message):
    script = _script(tmp_path, "print('hi')\n")
    with pytest.raises(SystemExit) as caught:
        main(["launch", "--workers", value, script])
    assert caught.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_refuses_an_elastic_parameter_server_job_and_a_bad_grace(tmp_path, capsys):
    script = _script(tmp_path, "print('hi')\n")
    assert main(["launch", "--workers", "2:3", "--ps", "1", script]) == 2
    err = capsys.readouterr().err
    assert "--workers 2:3 (an elastic job) does not go with --ps 1. HINT: a parameter-server" in err
    assert "e.g. --workers 3 --ps 1" in err
    for value in ("0", "-1", "soon"):
        with pytest.raises(SystemExit) as caught:
            main(["launch", "--grace", value, script])
        assert caught.value.code == 2
        assert f"argument --grace: '{value}' is not a positive number of seconds" in (
            capsys.readouterr().err
        )


def test_cli_dry_run_of_an_elastic_job_plans_its_most_workers(tmp_path, capsys):
    script = _script(tmp_path, "print('hi')\n")
    assert main(["launch", "--workers", "2:3", "--grace", "5", "--dry-run", script]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["[worker:0]", "[worker:1]", "[worker:2]"]


def test_the_last_lines_of_a_failed_task_leave_out_tensorflows_start_up_noise():
    output = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1796419575.249051    5153 port.cc:153] oneDNN custom operations are on.",
        "Traceback (most recent call last):",
        "E0000 00:00:1796419575.249051    5153 cuda_platform.cc:52] failed call to cuInit: x",
        "ValueError: the user's own error",
        "E0000 00:00:1796419575.249051    5153 some_op.cc:12] a real C++ error",
    ]
    task = TaskResult("worker:1", 1, output, 1.0)
    assert task.tail == (
        "Traceback (most recent call last):\nValueError: the user's own error\n"
        "E0000 00:00:1796419575.249051    5153 some_op.cc:12] a real C++ error"
    )
    assert task.output == output  # kept whole (and in the task's --log-dir file)


def test_the_summary_names_the_slowest_of_the_training_tasks():
    result = _result(
        "done",
        _task("worker:0", 0, 10.0, steps=100, train_seconds=5.0),
        _task("worker:1", 0, 10.0, steps=100, train_seconds=8.0),
        _task("ps:0", 0, 10.0, stopped=True, serves=True),
    )
    assert result.slowest == "worker:1"
    assert summary(result).endswith("[tfdist] The slowest task: worker:1, 12.5 steps/s.\n")
    data = result.as_dict()
    assert data["slowest"] == "worker:1" and data["tasks"]["worker:0"]["steps_per_second"] == 20
    assert data["tasks"]["ps:0"]["exit_code"] == 0 and data["tasks"]["ps:0"]["served"]
    alone = _result("done", _task("worker:0", 0, 10.0, steps=100, train_seconds=5.0))
    assert alone.slowest is None and "slowest" not in summary(alone)


def test_the_summary_gives_each_tasks_restarts():
    result = dataclasses.replace(
        _result(
            "done",
            _task("worker:0", 0, 10.0, steps=100, train_seconds=5.0),
            _task("worker:1", 0, 10.0, steps=100, train_seconds=5.0),
        ),
        restarts=2,
        task_restarts={"worker:0": 2, "worker:1": 1},  # worker:1 came back in the second attempt
    )
    lines = summary(result).splitlines()
    assert lines[0].endswith("100 steps in 5.0 s, 20.0 steps/s  (2 restarts before)"), lines
    assert lines[1].endswith("(1 restart before)"), lines
    data = result.as_dict()
    assert data["restarts"] == 2 and data["tasks"]["worker:1"]["restarts"] == 1, data
    first = _result("done", _task("worker:0", 0, 10.0, steps=100, train_seconds=5.0))
    assert "before" not in summary(first) and first.as_dict()["tasks"]["worker:0"]["restarts"] == 0
