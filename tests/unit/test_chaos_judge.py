"""The fault-injection campaign's judge (tests/chaos/campaign.py) fails a trial for each way a
job can go wrong; checked on trial folders written here, without TensorFlow."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

CAMPAIGN = pathlib.Path(__file__).resolve().parents[1] / "chaos" / "campaign.py"
_SPEC = importlib.util.spec_from_file_location("chaos_campaign", CAMPAIGN)
campaign = sys.modules["chaos_campaign"] = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(campaign)

WEIGHTS = [[[0.5, -1.0]], [0.25]]


def _trial(tmp_path, *, weights=WEIGHTS, iterations=campaign.TOTAL, exit_code=0, log=""):
    trial = campaign.Trial(0, "multi_worker_mirrored", "keras3", [], str(tmp_path / "t"))
    os.makedirs(trial.directory)
    run = campaign.Run(trial, marker=f"judge-{os.getpid()}")
    run.log.close()
    (pathlib.Path(trial.directory) / "launcher.log").write_text(log)
    if weights is not None:
        final = {"iterations": iterations, "weights": weights}
        (pathlib.Path(run.out) / "final.json").write_text(json.dumps(final))
    trial.exit_code = exit_code
    return trial, run


def _judged(trial, run):
    campaign.judge(trial, run, {"multi_worker_mirrored-keras3": WEIGHTS})
    return trial.problems


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


def test_a_corrupt_backup_needs_exactly_one_warning_from_the_leader(tmp_path):
    note = "truncated ckpt-4.data-00000-of-00001 to 10 of 20 bytes (/b/ckpt-4.data-00000-of-00001)"
    warning = "[worker:0] x.py:1: RuntimeWarning: the newest backup cannot be read: ckpt-4.index"
    for index, (log, problems) in enumerate(
        [(warning, 0), ("", 1), (warning + "\n" + warning, 1), (warning.replace("0]", "1]"), 1)]
    ):
        trial, run = _trial(tmp_path / str(index), log=log)
        trial.faults.append(campaign.Fault("corrupt_backup", "launcher", 5, note=note))
        assert len(_judged(trial, run)) == problems, log
