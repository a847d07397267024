"""Naming a lost task, without a cluster: how a lost ps is told from other TensorFlow errors
(a TCP probe of the ps addresses) and named. The faults in a real parameter-server cluster:
tests/cluster/test_parameter_server_faults.py."""

import pytest


class _FakeResolver:
    def __init__(self, cluster):
        self._cluster = cluster

    def cluster_spec(self):
        import tensorflow as tf

        return tf.train.ClusterSpec(self._cluster)


class _FakeStrategy:
    def __init__(self, cluster):
        self._cluster_resolver = _FakeResolver(cluster)


@pytest.fixture
def one_live_one_dead_ps():
    import socket

    live = socket.socket()
    live.bind(("127.0.0.1", 0))
    live.listen(1)
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
    addresses = [f"127.0.0.1:{s.getsockname()[1]}" for s in (live, dead)]
    yield _FakeStrategy({"worker": [addresses[0]], "ps": addresses}), addresses
    live.close()
    dead.close()


def test_the_ps_tasks_that_refuse_connections_are_named(one_live_one_dead_ps):
    from tfdist.parameter_server.watchdog import unreachable

    strategy, addresses = one_live_one_dead_ps
    assert unreachable(strategy) == [("ps:1", addresses[1])]
    assert unreachable(strategy, ("worker",)) == []


def test_a_tensorflow_error_after_a_ps_is_lost_becomes_task_unavailable(one_live_one_dead_ps):
    import tensorflow as tf

    from tfdist.parameter_server import TaskUnavailableError
    from tfdist.parameter_server.watchdog import naming_lost_tasks

    strategy, addresses = one_live_one_dead_ps
    with pytest.raises(TaskUnavailableError) as caught:
        with naming_lost_tasks(strategy):
            raise tf.errors.UnavailableError(None, None, "recvmsg:Connection reset by peer")
    assert caught.value.tasks == ["ps:1"] and caught.value.addresses == [addresses[1]]
    message = str(caught.value)
    assert f"ps:1 ({addresses[1]}) of the job is unreachable" in message
    assert "restore the last checkpoint" in message
    assert "UnavailableError: recvmsg:Connection reset by peer" in message
    assert isinstance(caught.value.__cause__, tf.errors.UnavailableError)


def test_other_errors_pass_through_when_every_ps_answers():
    import socket

    import tensorflow as tf

    from tfdist.parameter_server.watchdog import naming_lost_tasks

    with socket.socket() as live:
        live.bind(("127.0.0.1", 0))
        live.listen(1)
        strategy = _FakeStrategy({"ps": [f"127.0.0.1:{live.getsockname()[1]}"]})
        with pytest.raises(tf.errors.InvalidArgumentError):
            with naming_lost_tasks(strategy):
                raise tf.errors.InvalidArgumentError(None, None, "bad shape")
        with pytest.raises(ValueError):
            with naming_lost_tasks(strategy):
                raise ValueError("not TensorFlow's")
