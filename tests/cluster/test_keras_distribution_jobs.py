"""The keras.io guide's DataParallel code, unmodified, on TensorFlow through tfdist: on 2
logical CPUs in one process; as a 2-process job started by `tfdist launch` (the script never
imports tfdist: the launcher's start-up hook does); as 2 processes joined by
`keras.distribution.initialize(job_addresses=..., process_id=...)` and its environment-variable
form; and as a 2-task SLURM step (its variables faked; the script never calls initialize()).
Each reaches the weights of one-device training with the same global batch.

Each record of tfdist.keras_distribution is removed once (TFDIST_KERAS_FIXES=-name) to show
the upstream behaviour it fixes. In-process cases: tests/inprocess/test_keras_distribution.py."""

import concurrent.futures
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tfdist import flavour
from tfdist.cluster.spec import free_ports
from tfdist.launcher import launch

from helpers.paths import EXAMPLES, SCRIPTS, TESTS
from helpers.scheduler import srun_step_environment, two_consecutive_free_ports

if flavour.uses_legacy_keras():
    pytest.skip("tf_keras has no keras.distribution", allow_module_level=True)

GUIDE = str(EXAMPLES / "keras_distribution" / "data_parallel.py")
HARNESS = str(SCRIPTS / "keras_guide.py")
TIMEOUT = 600
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2"}


def _env(without=None):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TFDIST_KERAS_FIXES")}
    env.update(QUIET)
    if without:
        env["TFDIST_KERAS_FIXES"] = f"-{without}"
    return env


def _process(out, *options, without=None):
    proc = subprocess.run(
        [sys.executable, HARNESS, GUIDE, str(out), *options],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=_env(without),
    )
    return proc.returncode, proc.stdout + proc.stderr


def _job(out, without=None, script=GUIDE):
    """`tfdist launch --workers 2` of the harness, which itself does not import tfdist."""
    output = io.StringIO()
    extra = dict(QUIET, TFDIST_KERAS_FIXES=f"-{without}" if without else "")
    codes = launch(
        HARNESS, [script, str(out)], workers=2, out=output, timeout=TIMEOUT, extra_env=extra
    )
    return (0 if all(c == 0 for c in codes.values()) else 1), output.getvalue()


def _two_processes(out, options, environments):
    procs = [
        subprocess.Popen(
            [sys.executable, HARNESS, GUIDE, str(out), "--import-tfdist", *option],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(_env(), **environment),
        )
        for option, environment in zip(options, environments)
    ]
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=TIMEOUT)[0])
        except subprocess.TimeoutExpired:
            proc.kill()
            outputs.append(proc.communicate()[0])
    return (max(p.returncode for p in procs) != 0), "\n".join(outputs)


def _explicit(out):
    """Two processes joined by initialize(): process 0 by arguments, process 1 by variables."""
    addresses = ",".join(f"localhost:{port}" for port in free_ports(2))
    options = [("--initialize", addresses, "0"), ("--initialize", addresses, "env")]
    return _two_processes(out, options, [{}, {}])


def _slurm(out):
    """A 2-task srun step (its variables faked): the script never calls initialize()."""
    port = two_consecutive_free_ports()
    environments = [srun_step_environment(rank, port) for rank in range(2)]
    return _two_processes(out, [(), ()], environments)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("keras_distribution")
    runs = {
        # one device: the distribution is set but not carried (the upstream no-op)
        "reference": (_process, ("--cpus", "2"), {"without": "keras_distribution_strategy"}),
        "two_cpus": (_process, ("--cpus", "2"), {}),
        "two_processes": (_job, (), {}),
        "initialize": (_explicit, (), {}),
        "slurm": (_slurm, (), {}),
        "no_dataset_fix": (_job, (), {"without": "keras_distribution_dataset"}),
        "own_shards": (_job, (), {"script": str(SCRIPTS / "keras_own_shards.py")}),
        "no_backend_fix": (_job, (), {"without": "keras_distribution_backend"}),
    }
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futures = {
            name: pool.submit(fn, base / name, *args, **kwargs)
            for name, (fn, args, kwargs) in runs.items()
        }
        results = {name: future.result() for name, future in futures.items()}
    return {name: (code, output, base / name) for name, (code, output) in results.items()}


def _result(runs, name, process=0):
    code, output, out = runs[name]
    assert code == 0, output[-4000:]
    with open(out / f"{process}.json") as f:
        facts = json.load(f)
    weights = np.load(out / f"{process}.npz")
    return facts, [weights[k] for k in weights.files]


def _same(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def _both_processes_like_one_device(runs, name):
    """Each process's facts, once both processes' weights equal one-device training's."""
    expected = _result(runs, "reference")[1]
    facts = []
    for process in (0, 1):
        process_facts, weights = _result(runs, name, process)
        _same(weights, expected)
        facts.append(process_facts)
    return facts


def test_without_tfdist_the_distribution_trains_on_one_device(runs):
    facts, _ = _result(runs, "reference")
    assert facts["devices"] == ["cpu:0", "cpu:1"] and facts["replicas"] == 1


def test_the_guide_on_two_logical_cpus_equals_one_device(runs):
    facts, weights = _result(runs, "two_cpus")
    assert facts == {"replicas": 2, "processes": 1, "devices": ["cpu:0", "cpu:1"], "iterations": 24}
    _same(weights, _result(runs, "reference")[1])


def test_the_guide_as_a_two_process_job_equals_one_device(runs):
    for facts in _both_processes_like_one_device(runs, "two_processes"):
        # 3 epochs of 8 global batches of 16, each split over the 2 processes
        assert facts == {
            "replicas": 2,
            "processes": 2,
            "devices": ["cpu:0", "cpu:1"],
            "iterations": 24,
        }


def test_initialize_with_job_addresses_or_variables_joins_two_processes(runs):
    for facts in _both_processes_like_one_device(runs, "initialize"):
        assert (facts["replicas"], facts["processes"]) == (2, 2)


def _auto_shard_argument():
    import inspect

    from keras.src.distribution.distribution_lib import DataParallel

    return "auto_shard_dataset" in inspect.signature(DataParallel.__init__).parameters


def test_each_process_its_own_data_with_auto_shard_dataset_off(runs):
    if not _auto_shard_argument():
        pytest.skip("auto_shard_dataset is an argument from Keras 3.11")
    for facts in _both_processes_like_one_device(runs, "own_shards"):
        assert (facts["replicas"], facts["iterations"]) == (2, 24)


def test_a_slurm_step_is_joined_without_initialize(runs):
    for facts in _both_processes_like_one_device(runs, "slurm"):
        assert (facts["replicas"], facts["processes"]) == (2, 2)


def test_without_the_dataset_fix_each_process_trains_on_a_share_of_a_share(runs):
    facts, weights = _result(runs, "no_dataset_fix")
    if flavour.keras_version_tuple() < (3, 16):  # shards by element: more, uneven batches
        assert facts["iterations"] != 24  # batches of 4 (16 / 2 / 2), uneven at the ends
    # (Keras 3.16 rebatches instead: as many steps, each on a quarter of the global batch)
    assert (
        max(float(np.max(np.abs(w - e))) for w, e in zip(weights, _result(runs, "reference")[1]))
        > 1e-3
    )


def test_without_the_backend_fix_the_processes_do_not_form_a_job(runs):
    code, output, _ = runs["no_backend_fix"]
    assert code != 0
    upstream = (
        "must be built before TensorFlow initialises",  # the prototype listed local devices
        "has no attribute 'num_processes'",  # Keras < 3.15 needs the backend's count
    )
    assert any(text in output for text in upstream), output[-3000:]


def test_without_the_row_sharding_fix_the_table_is_whole_on_one_device():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "row_sharded_embedding",
        ]
        + [str(TESTS / "inprocess" / "test_keras_distribution.py")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=str(TESTS.parent),
        env=_env("keras_distribution_row_sharded_variables"),
    )
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "isinstance(table.value, sharded_variable.ShardedVariable)" in proc.stdout
