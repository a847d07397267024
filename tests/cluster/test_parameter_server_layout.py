"""Tier 3: one script in every role of a parameter-server job.

A Kubernetes TFJob with chief, worker and ps replicas starts the same command in every replica;
only TF_CONFIG differs. Here: a chief, 2 workers and 1 ps on loopback, each a separate process
started by tfdist's launcher with its own TF_CONFIG, every one running the same script. The
launcher's own plan runs `python -m tfdist serve` in the server tasks; these tests replace that
with the script, as the TFJob would. The worker and ps tasks block in `make_strategy` (they
serve); the chief trains through them with tfdist's fit; the job ends when the chief exits 0.
"""

import dataclasses
import json
import os
import re

import pytest

from tfdist.launcher import plan_job, run_job
from tfdist.testing import is_running

from helpers.paths import EXAMPLES, SCRIPTS

pytestmark = pytest.mark.slow

SCRIPT = os.path.join(SCRIPTS, "ps_train.py")
EXAMPLE = os.path.join(EXAMPLES, "train.py")
ROLES = ["chief:0", "worker:0", "worker:1", "ps:0"]
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}


def _same_command_everywhere(script, args):
    """The launcher's plan for a 2-worker, 1-ps job, with `script` in the server tasks too."""
    plans = plan_job(script, args, workers=2, ps=1, extra_env=ENV)
    chief = next(p for p in plans if p.task == "chief:0")
    plans = [dataclasses.replace(p, argv=chief.argv) if p.serves else p for p in plans]
    assert sorted(p.task for p in plans) == sorted(ROLES)
    assert len({p.argv for p in plans}) == 1  # one command line ...
    assert len({p.env["TF_CONFIG"] for p in plans}) == 4  # ... four TF_CONFIGs
    return plans


def _tails(result) -> str:
    return "\n".join(
        f"--- {name} (exit {r.returncode})\n{r.tail}" for name, r in result.tasks.items()
    )


def _assert_ended_by_the_chief(result):
    assert result.ok, _tails(result)
    assert result.tasks["chief:0"].returncode == 0
    assert not result.tasks["chief:0"].stopped
    for task in ("worker:0", "worker:1", "ps:0"):
        # still serving when the chief finished: the launcher stopped them, the job is done
        assert result.tasks[task].stopped, _tails(result)
    assert result.returncodes == {task: 0 for task in ROLES}


def test_the_same_script_serves_in_worker_and_ps_tasks_and_trains_in_the_chief(tmp_path):
    plans = _same_command_everywhere(SCRIPT, [str(tmp_path), "2"])
    result = run_job(plans, timeout=300, grace=5.0, quiet=True)
    _assert_ended_by_the_chief(result)

    # every task ran the script, with its own TF_CONFIG ...
    for task in ROLES:
        started = json.loads((tmp_path / f"{task.replace(':', '-')}.started").read_text())
        config = json.loads(started["TF_CONFIG"])
        assert f"{config['task']['type']}:{config['task']['index']}" == task
        assert started["argv"][0] == SCRIPT
        assert not is_running(started["pid"])  # and nothing outlived the job
    # ... but only the chief got past make_strategy: the others served
    assert sorted(p.name for p in tmp_path.glob("*.trains")) == ["chief-0.trains"]

    run = json.loads((tmp_path / "result.json").read_text())
    assert run["task"] == "chief:0"
    assert run["strategy"] == "ParameterServerStrategyV2"
    assert run["workers"] == 2
    assert run["iterations"] == 2 * run["steps_per_epoch"]  # exact, over both workers
    # what the launcher's summary reports: the chief's training steps; the servers trained none
    assert result.tasks["chief:0"].steps == run["iterations"]
    assert result.tasks["chief:0"].steps_per_second > 0
    assert all(result.tasks[task].steps is None for task in ("worker:0", "worker:1", "ps:0"))
    assert all(d.startswith("/job:ps/") for d in run["variable_devices"])
    assert run["history"]["loss"][-1] < run["history"]["loss"][0]
    assert run["evaluate"]["acc"] > 0.8
    assert "chief:0: trained 2 epoch(s)" in result.tasks["chief:0"].tail


def test_examples_train_py_runs_unchanged_in_every_role(tmp_path):
    plans = _same_command_everywhere(EXAMPLE, ["--epochs", "2"])
    result = run_job(plans, timeout=300, grace=5.0, quiet=True)
    _assert_ended_by_the_chief(result)
    text = "\n".join(result.tasks["chief:0"].output)
    match = re.search(r"ParameterServerStrategyV2: held-out accuracy ([0-9.]+)", text)
    assert match, result.tasks["chief:0"].tail
    assert float(match.group(1)) > 0.8
