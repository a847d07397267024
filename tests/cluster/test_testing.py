"""The tfdist.testing plugin, as a user's own test suite sees it (installed entry point), and
run_cluster's report of each task."""

import textwrap

import pytest

from tfdist.testing import run_cluster


def test_plugin_fixtures_in_a_users_suite(pytester):
    pytester.makeini(
        textwrap.dedent("""
        [pytest]
        tfdist_virtual_cpus = 3
        tfdist_env_guard = true
    """)
    )
    pytester.makepyfile(
        textwrap.dedent("""
        import os
        import pytest

        def test_virtual_cpus(virtual_cpus):
            import tensorflow as tf
            assert virtual_cpus == ["/cpu:0", "/cpu:1", "/cpu:2"]
            assert len(tf.config.list_logical_devices("CPU")) == 3

        def test_free_ports(free_ports):
            ports = free_ports(3) + free_ports(3)
            assert len(set(ports)) == 6

        def test_leaks_tf_config():
            os.environ["TF_CONFIG"] = "{}"

        def test_monkeypatch_is_fine(monkeypatch):
            monkeypatch.setenv("TFDIST_NUM_PS", "1")

        @pytest.mark.requires_gpu(n=1)
        def test_needs_gpu():
            raise AssertionError("must be skipped on a host without GPUs")
    """)
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=4, errors=1, skipped=1)  # the leak fails in teardown
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leaks_tf_config*",
            "*The test changed environment variable(s) ?'TF_CONFIG'? and did not restore them*",
            "*needs 1 GPU(s); this host has 0*",
        ]
    )


def fail_on_worker_one():
    import os
    import sys

    if os.environ["TFDIST_TASK"] == "worker:1":
        print("worker one gives up")
        sys.exit(4)
    return "done"


def test_run_cluster_reports_each_task_and_its_output():
    runs = run_cluster(fail_on_worker_one, workers=2, check=False, timeout=60)
    assert runs["worker:1"].returncode == 4
    assert "worker one gives up" in runs["worker:1"].output
    assert runs["worker:0"].returncode in (0, -15)  # done, or stopped when its peer failed
    from tfdist.testing import ClusterRunError

    with pytest.raises(
        ClusterRunError,
        match=r"(?s)failed\..*--- worker:1: exit code 4.*"
        r"worker one gives up",
    ):
        run_cluster(fail_on_worker_one, workers=2, timeout=60)


def test_the_strategies_marker_runs_a_body_under_each_strategy_in_shared_processes(
    pytester, tmp_path
):
    """A user's suite: 2 tests on 3 and 2 strategies, one failing test; every run of a strategy
    reuses its pool's processes (3 processes in all: one local, two workers)."""
    seen = tmp_path / "pids"
    seen.mkdir()
    pytester.makepyfile(
        test_user=textwrap.dedent(f"""
        import os
        import pytest

        SEEN = {str(seen)!r}

        def note(strategy):
            with open(os.path.join(SEEN, str(os.getpid())), "a") as f:
                f.write(type(strategy).__name__ + "\\n")

        @pytest.mark.tfdist_strategies(
            "one_device", "mirrored", "multi_worker_mirrored", replicas=3
        )
        def test_sum(strategy, tmp_path):
            import tensorflow as tf

            note(strategy)
            assert tmp_path.exists()  # a fixture's value, sent along
            total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
            print("replicas in sync:", strategy.num_replicas_in_sync)
            assert float(total) == strategy.num_replicas_in_sync

        @pytest.mark.tfdist_strategies("mirrored", "multi_worker_mirrored", replicas=3)
        def test_again(strategy):
            note(strategy)

        @pytest.mark.tfdist_strategies("mirrored", replicas=3)
        def test_wrong(strategy):
            assert strategy.num_replicas_in_sync == 2, "not 2 replicas"
    """)
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", "-rP")
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_sum?one_device? PASSED*",
            "*test_sum?multi_worker_mirrored? PASSED*",
            "*--- mirrored worker:0: AssertionError: not 2 replicas*",
        ]
    )
    assert "replicas in sync: 3" in result.stdout.str()
    kinds = {pid.name: set(pid.read_text().split()) for pid in seen.iterdir()}
    assert sorted(len(runs) for runs in kinds.values()) == [1, 1, 2], kinds
    assert {"OneDeviceStrategy", "MirroredStrategy"} in kinds.values()
