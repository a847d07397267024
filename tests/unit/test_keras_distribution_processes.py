"""keras.distribution.initialize() on TensorFlow, as data: which job each form of arguments
describes and the errors for those that describe none (tfdist.keras_distribution.processes).
Joining a real job: tests/cluster/test_keras_distribution_jobs.py."""

import pytest

from tfdist.keras_distribution import processes


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch):
    monkeypatch.setattr(processes, "_STATE", {"cluster": None, "strategy": None})
    for name in ("TF_CONFIG", "SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)


def test_explicit_addresses_describe_a_job_of_workers():
    cluster = processes._explicit_cluster(" h0:2222, h1:2222 ", 2, 1)
    assert cluster.cluster == {"worker": ["h0:2222", "h1:2222"]}
    assert (cluster.task_type, cluster.task_index) == ("worker", 1)
    assert processes._explicit_cluster(["h0:1", "h1:1", "h2:1"], None, 2).num_workers == 3


@pytest.mark.parametrize(
    "addresses, count, process, error, message",
    [
        ("h0:2222", 2, 0, ValueError, r"1 address\(es\) for 2 processes.*lists all of them"),
        ("h0:1,h1:1", 3, 0, ValueError, r"2 address\(es\) for 3 processes"),
        ("h0:1,h1:1", 2, 2, ValueError, r"process_id must be an integer in \[0, 2\)"),
        ("h0:1,h1:1", 2, None, ValueError, "process_id must be an integer"),
        ("h0:1,h1:1", 0, 0, ValueError, "num_processes must be a positive integer"),
        (2222, 1, 0, TypeError, "job_addresses must be a string"),
    ],
)
def test_arguments_that_describe_no_job_are_refused(addresses, count, process, error, message):
    with pytest.raises(error, match=message):
        processes.initialize(addresses, count, process)
    assert processes.num_processes() == 1 and processes.process_id() == 0


def test_a_count_without_addresses_says_tensorflow_needs_them():
    with pytest.raises(ValueError, match="needs job_addresses on TensorFlow"):
        processes.initialize(num_processes=2, process_id=1)


def test_one_process_is_a_no_op_and_a_second_different_job_is_refused():
    processes.initialize()  # no cluster in the environment: a single process
    processes.initialize()
    assert processes.num_processes() == 1 and processes.strategy() is None
    with pytest.raises(RuntimeError, match="already called"):
        processes.initialize("h0:1", 1, 0)


def test_a_job_with_parameter_servers_is_refused(monkeypatch):
    monkeypatch.setenv(
        "TF_CONFIG",
        '{"cluster": {"chief": ["h:1"], "worker": ["h:2"], "ps": ["h:3"]},'
        ' "task": {"type": "chief", "index": 0}}',
    )
    with pytest.raises(ValueError, match="has a 'ps' job"):
        processes.initialize()


def test_process_ids_count_the_chief_first(monkeypatch):
    from tfdist import ClusterSpec

    cluster = ClusterSpec({"chief": ["h:1"], "worker": ["h:2", "h:3"]}, "worker", 1)
    monkeypatch.setitem(processes._STATE, "cluster", cluster)
    assert (processes.num_processes(), processes.process_id()) == (3, 2)
