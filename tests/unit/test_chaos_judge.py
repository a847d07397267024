"""The fault-injection campaign's judge (tests/chaos/campaign.py) fails a trial for each way a
job can go wrong; checked on trial folders written here, without TensorFlow."""

import dataclasses
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

CAMPAIGN = pathlib.Path(__file__).resolve().parents[1] / "chaos" / "campaign.py"
_SPEC = importlib.util.spec_from_file_location("chaos_campaign", CAMPAIGN)
campaign = sys.modules["chaos_campaign"] = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(campaign)

WEIGHTS = [[[0.5, -1.0]], [0.25]]
HEARTBEATS = (
    "The following tasks are unhealthy (stopped sending heartbeats): /job:worker/replica:0/task:"
)


def _trial(tmp_path, *, weights=WEIGHTS, iterations=campaign.TOTAL, exit_code=0, log="", starts=""):
    trial = campaign.Trial(0, "multi_worker_mirrored", "keras3", [], str(tmp_path / "t"))
    os.makedirs(trial.directory)
    run = campaign.Run(trial, marker=f"judge-{os.getpid()}")
    run.log.close()
    (pathlib.Path(trial.directory) / "launcher.log").write_text(log)
    (pathlib.Path(run.out) / "starts.log").write_text(starts)
    if weights is not None:
        final = {"iterations": iterations, "weights": weights}
        (pathlib.Path(run.out) / "final.json").write_text(json.dumps(final))
    trial.exit_code = exit_code
    return trial, run


def _judged(trial, run):
    key = campaign.reference_key(trial.strategy, trial.flavour, trial.workers, trial.ps)
    campaign.judge(trial, run, {key: WEIGHTS})
    return trial.problems


def _injected(kind, task, at_step, **fields):
    """A fault as `run_trial` leaves it once injected and recovered from."""
    return campaign.Fault(kind, task, at_step, injected_at=1.0, step_then=at_step, **fields)


def test_a_trial_that_went_well_survives(tmp_path):
    assert _judged(*_trial(tmp_path)) == []


def test_each_way_of_going_wrong_fails_the_trial(tmp_path):
    cases = {
        "weights": dict(weights=[[[0.5, -1.0]], [0.2500001]]),
        "optimizer step": dict(iterations=campaign.TOTAL - 2),
        "exited with 1": dict(exit_code=1),
        "no final weights": dict(weights=None),
    }
    for index, (text, changes) in enumerate(cases.items()):
        problems = _judged(*_trial(tmp_path / str(index), **changes))
        assert len(problems) == 1 and text in problems[0], (text, problems)


def test_a_file_left_in_tmpdir_and_a_process_left_running_fail_the_trial(tmp_path, monkeypatch):
    monkeypatch.setattr(campaign, "SETTLE", 0.5)
    trial, run = _trial(tmp_path)
    pathlib.Path(run.tmp, "tfdist-reports-x").mkdir()
    pathlib.Path(run.tmp, campaign.AUTOGRAPH_FILES + "1.py").touch()  # TensorFlow's own
    env = dict(os.environ, CHAOS_TRIAL=run.marker)
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        problems = _judged(trial, run)
    finally:
        left.kill()
        left.wait()
    assert any("left in TMPDIR: ['tfdist-reports-x']" in p for p in problems), problems
    assert any("1 process(es) outlived the job" in p for p in problems), problems


NOTE = "truncated ckpt-4.data-00000-of-00001 to 10 of 20 bytes (/b/ckpt-4.data-00000-of-00001)"
WARNING = "[worker:0] x.py:1: RuntimeWarning: the newest backup cannot be read: ckpt-4.index"


def _corrupted(tmp_path, *, starts, log=WARNING, resume_expected=2, starts_then=1):
    """A trial whose newest backup (ckpt-4, step 4) was corrupted once training had started
    `starts_then` times, the backup before it being that of optimizer step `resume_expected`."""
    trial, run = _trial(tmp_path, log=log, starts=starts)
    fault = campaign.Fault(
        "corrupt_backup",
        "launcher",
        5,
        note=NOTE,
        starts_then=starts_then,
        resume_expected=resume_expected,
    )
    trial.faults.append(fault)
    return trial, run


def test_a_corrupt_backup_needs_exactly_one_warning_from_the_leader(tmp_path):
    for index, (log, problems) in enumerate(
        [(WARNING, 0), ("", 1), (WARNING + "\n" + WARNING, 1), (WARNING.replace("0]", "1]"), 1)]
    ):
        trial, run = _corrupted(tmp_path / str(index), log=log, starts="11 0\n12 2\n")
        assert len(_judged(trial, run)) == problems, log


def test_a_corrupt_backup_resumes_from_the_backup_before_it_not_from_scratch(tmp_path):
    """The weights end equal after a restart from scratch too: only the step the restart
    restored (OUT/starts.log, "PID STEP" a line) tells it from the fallback the docs promise."""
    trial, run = _corrupted(tmp_path / "fallback", starts="11 0\n12 2\n")
    assert _judged(trial, run) == []
    assert trial.faults[0].resumed_at == 2

    trial, run = _corrupted(tmp_path / "scratch", starts="11 0\n12 0\n")
    problems = _judged(trial, run)
    assert len(problems) == 1 and "from scratch (step 0)" in problems[0], problems
    assert "not at step 2 of the backup before it" in problems[0], problems

    trial, run = _corrupted(tmp_path / "newest", starts="11 0\n12 4\n")  # the corrupt one?
    problems = _judged(trial, run)
    assert len(problems) == 1 and "resumed at step 4" in problems[0], problems

    trial, run = _corrupted(tmp_path / "never", starts="11 0\n")
    problems = _judged(trial, run)
    assert len(problems) == 1 and "no start of training after" in problems[0], problems

    # The only backup corrupted: the job must refuse to go on, not start again from scratch.
    trial, run = _corrupted(tmp_path / "only", starts="11 0\n12 0\n", resume_expected=None)
    problems = _judged(trial, run)
    assert len(problems) == 1 and "no backup was left before ckpt-4" in problems[0], problems


def test_each_fault_is_recovered_from_within_the_bound(tmp_path):
    for index, (recovery, text) in enumerate(
        [(12.0, None), (None, "no restart trained past step 9"), (400.0, "more than 150 s")]
    ):
        trial, run = _trial(tmp_path / str(index))
        trial.faults.append(_injected("kill_worker", "worker:1", 9, recovery=recovery))
        problems = _judged(trial, run)
        if text is None:
            assert problems == []
        else:
            assert len(problems) == 1 and text in problems[0], problems


def test_a_freeze_is_judged_on_its_bound_and_on_the_task_the_job_names(tmp_path):
    """After SIGSTOP of worker:2, a job that names a task as having stopped sending heartbeats
    must name worker:2; one that stops must name it; recovery is bounded as for any fault."""
    cases = [
        ("", 0, 20.0, []),  # detected by the collective timeout, named nowhere: fine
        (f"[worker:0] {HEARTBEATS}2", 0, 20.0, []),
        (FROZEN_OUTPUT.replace("task:1\n", "task:2\n"), 0, 20.0, []),
        (FROZEN_OUTPUT, 0, 20.0, ["['worker:1'] stopped sending heartbeats"]),
        (f"[worker:0] {HEARTBEATS}1", 0, 20.0, ["['worker:1'] stopped sending heartbeats"]),
        (f"[worker:0] {HEARTBEATS}0, /job:worker/replica:0/task:2", 0, 20.0, ["['worker:0']"]),
        (f"[worker:0] {HEARTBEATS}2", 0, 200.0, ["more than 150 s"]),
        (f"[worker:0] {HEARTBEATS}2", 1, None, ["exited with 1", "no restart trained"]),
        (
            "[worker:0] DeadlineExceededError: Collective ops timed out",
            1,
            None,
            ["exited with 1", "no restart trained", "without a message naming the frozen task"],
        ),
    ]
    for index, (text, exit_code, recovery, expected) in enumerate(cases):
        before = "=== launch 1\n[worker:2] " + HEARTBEATS + "1 (a line before the freeze)\n"
        trial, run = _trial(tmp_path / str(index), log=before + text, exit_code=exit_code)
        trial.workers = 3
        if exit_code:
            os.remove(os.path.join(run.out, "final.json"))
            expected = [*expected, "no final weights"]
        fault = _injected("freeze", "worker:2", 9, recovery=recovery, log_at=len(before))
        trial.faults.append(fault)
        problems = _judged(trial, run)
        assert len(problems) == len(expected), (text, problems)
        for part in expected:
            assert any(part in p for p in problems), (part, problems)


# As TensorFlow 2.21 says it, through the launcher, after SIGSTOP of worker:1 of 3 (a
# campaign's trial): the tasks on the next line, another task's lines in between.
FROZEN_OUTPUT = """\
[worker:2] E0000 base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort \
UNAVAILABLE: Error reported from /job:worker/task:1: The following tasks are unhealthy \
(stopped sending heartbeats):
[worker:0] E0000 ring_alg.cc:291] Aborting RingReduce with UNAVAILABLE: Collective ops is \
aborted by: Error reported from /job:worker/task:1: The following tasks are unhealthy \
(stopped sending heartbeats):
[worker:2] /job:worker/replica:0/task:1
[worker:2] The tasks have crashed. Check the task logs for an earlier error.
[worker:0] /job:worker/replica:0/task:1
[worker:2] Additional GRPC error information from remote target /job:worker/replica:0/task:0 while \
calling /tensorflow.WorkerService/RecvBuf:
[tfdist] Task worker:0 exited with code 1; the other tasks were stopped. Its last lines:
Collective ops is aborted by: Error reported from /job:worker/task:1: The following tasks are \
unhealthy (stopped sending heartbeats):
/job:worker/replica:0/task:1
The tasks have crashed.
"""


def test_the_tasks_named_unresponsive_are_read_from_tensorflows_message():
    assert campaign.unresponsive_tasks(FROZEN_OUTPUT) == ["worker:1"]
    assert campaign.unresponsive_tasks(FROZEN_OUTPUT.replace("task:1\n", "task:2\n", 1)) == [
        "worker:1",
        "worker:2",
    ]
    text = f"[worker:0] {HEARTBEATS}1, /job:worker/replica:0/task:2\n[worker:0] The tasks..."
    assert campaign.unresponsive_tasks(text) == ["worker:1", "worker:2"]
    assert (
        campaign.unresponsive_tasks("[worker:0] Socket closed /job:worker/replica:0/task:1") == []
    )


def test_a_network_cut_not_injected_counts_nowhere(tmp_path):
    """A job without a private network namespace cannot have its network cut: the fault says
    why, and the trial is neither survived nor failed (nor counted in network_cut's row)."""
    cut = campaign.Fault("network_cut", "worker:1", 9, injected_at=1.0)
    cut.skipped = cut.note = f"not injected: {campaign.NO_NAMESPACE}"
    trial, run = _trial(tmp_path / "cut")
    trial.faults.append(cut)
    assert _judged(trial, run) == []
    assert not trial.tested and not trial.survived
    both, run = _trial(tmp_path / "both")
    both.index = 1
    both.faults += [_injected("kill_worker", "worker:1", 5, recovery=9.0), cut]
    assert _judged(both, run) == [] and both.tested and both.survived
    text = campaign.report([trial, both], str(tmp_path), 60.0)
    assert "1 of 1 trials survived (1 min); 1 more injected no fault" in text, text
    assert "| kill_worker | 1 | 1 | 9.0 s | 9.0 s |" in text, text
    assert "| network_cut |" not in text, text
    assert f"Not counted: network_cut in 2 trial(s), not injected: {campaign.NO_NAMESPACE}" in text
    rows = json.loads((tmp_path / "chaos.json").read_text())
    assert [(r["survived"], r["tested"]) for r in rows] == [(False, False), (True, True)]
    assert rows[0]["faults"][0]["skipped"] == f"not injected: {campaign.NO_NAMESPACE}"


def test_the_plan_draws_each_trials_shape_from_its_seed(tmp_path):
    """multi_worker_mirrored with 2 or 3 workers, parameter_server with 2 workers and 1 or 2
    ps, the tasks hit among those the shape has; the same seed, the same plan."""
    plan = campaign.plan_trials(60, 3, list(campaign.FAULTS), str(tmp_path))
    shapes = {(t.strategy, t.workers, t.ps) for t in plan}
    assert shapes == {
        ("multi_worker_mirrored", 2, 0),
        ("multi_worker_mirrored", 3, 0),
        ("parameter_server", 2, 1),
        ("parameter_server", 2, 2),
    }
    for trial in plan:
        for fault in trial.faults:
            job, _, number = fault.task.partition(":")
            if job == "worker":
                assert 1 <= int(number) < trial.workers, (trial, fault)
            if job == "ps":
                assert int(number) < trial.ps, (trial, fault)
    again = campaign.plan_trials(60, 3, list(campaign.FAULTS), str(tmp_path))
    assert [dataclasses.asdict(t) for t in again] == [dataclasses.asdict(t) for t in plan]
    assert any(t.ps == 2 and t.faults[0].task == "ps:1" for t in plan)


def test_each_shape_has_its_own_uninterrupted_run(tmp_path):
    """A 3-worker trial is compared with a 3-worker run: one of 2 workers splits the global
    batch otherwise, and the last bits of its weights differ."""
    trial, run = _trial(tmp_path / "3")
    trial.workers = 3
    campaign.judge(trial, run, {campaign.reference_key(trial.strategy, "keras3", 2): WEIGHTS})
    assert trial.problems == [
        "no uninterrupted run of multi_worker_mirrored-keras3-3w-0ps to compare the final "
        "weights with"
    ]
    trial, run = _trial(tmp_path / "other", weights=[[[0.5, -1.0]], [0.2500001]])
    trial.workers = 3
    problems = _judged(trial, run)
    assert problems == ["the final weights differ from those of an uninterrupted run (3 workers)"]


def test_a_trial_runs_its_shape(tmp_path):
    trial = campaign.Trial(0, "parameter_server", "keras3", [], str(tmp_path / "t"), ps=2)
    os.makedirs(trial.directory)
    run = campaign.Run(trial, marker="shape")
    run.log.close()
    assert run.argv[run.argv.index("--workers") + 1] == "2"
    assert run.argv[run.argv.index("--ps") + 1] == "2"
    trial = campaign.Trial(1, "multi_worker_mirrored", "keras3", [], str(tmp_path / "u"), workers=3)
    os.makedirs(trial.directory)
    run = campaign.Run(trial, marker="shape")
    run.log.close()
    assert run.argv[run.argv.index("--workers") + 1] == "3" and "--ps" not in run.argv


def test_the_documented_options_are_the_parsers():
    """The usage in the module's docstring names exactly the options that argparse defines."""
    documented = set(re.findall(r"\[(--[a-z-]+)", campaign.__doc__))
    parser_options = {"--trials", "--seed", "--out", "--faults", "--only", "--keep"}
    assert documented == parser_options
    try:
        campaign.main(["--quick"])
    except SystemExit as exit:
        assert exit.code == 2
    else:
        raise AssertionError("--quick was accepted")
