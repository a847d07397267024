"""Waits on peers are bounded, end at once on SIGTERM / SIGINT, and name the missing tasks.

A task of a real cluster whose peers never come: a worker of 2 started alone, the coordination
leader started alone, an evaluator whose workers never come, the chief of a parameter-server
job whose servers never come. Before tfdist waited itself (tfdist.strategy.peers), such a task
ignored SIGTERM (TensorFlow's preemption notifier catches it) until its start-up timeout, and the
leader waited for an hour whatever the timeout. One real TensorFlow process per case.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from tfdist import ClusterSpec
from tfdist.strategy import peers

pytestmark = pytest.mark.slow

CODE = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even if inherited
print("PID", os.getpid(), flush=True)
import tfdist
tfdist.make_strategy()
print("FORMED", flush=True)
"""


_STARTED = []


@pytest.fixture(autouse=True)
def _no_task_outlives_its_test():
    """A test that fails half-way leaves no waiting task (nor its guardian) behind."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def _start(spec, timeout=300, **env):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TFDIST_", "SLURM_"))}
    environ.update(TF_CONFIG=spec.to_json(), TFDIST_STARTUP_TIMEOUT=str(timeout), **env)
    proc = subprocess.Popen(
        [sys.executable, "-c", CODE],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a group of its own, as under the launcher
    )
    _STARTED.append(proc)
    return proc


def _wait_for_the_wait(proc):
    """Reads up to tfdist's notice that the task waits for its peers (after 10 s of waiting)."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "waits for its peers" in line:
            return
    raise AssertionError("the task never waited:\n" + "".join(lines))


def _signal_and_time(proc, sig):
    started = time.monotonic()
    proc.send_signal(sig)
    try:
        output = proc.communicate(timeout=30)[0]
    finally:
        proc.kill()
    return time.monotonic() - started, output


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_worker_whose_peer_never_comes_ends_at_once_on_a_signal(sig):
    spec = ClusterSpec.local(workers=2, task_type="worker", task_index=1)
    proc = _start(spec)
    _wait_for_the_wait(proc)
    seconds, output = _signal_and_time(proc, sig)
    assert seconds < 5, output
    assert proc.returncode != 0
    assert "FORMED" not in output
    name = signal.Signals(sig).name
    assert f"tfdist: task worker:1 received {name} while it waited for its peers" in output
    assert f"still missing: worker:0 ({spec.cluster['worker'][0]})" in output, output
    assert "HINT:" in output


def test_an_evaluator_whose_workers_never_come_ends_at_once_on_sigterm():
    spec = ClusterSpec.local(workers=2, evaluator=True, task_type="evaluator", task_index=0)
    proc = _start(spec)
    _wait_for_the_wait(proc)
    seconds, output = _signal_and_time(proc, signal.SIGTERM)
    assert seconds < 5, output
    assert proc.returncode != 0
    assert "tfdist: task evaluator:0 received SIGTERM" in output, output
    assert "still missing: worker:0" in output and "worker:1" in output


def test_the_leader_alone_fails_after_the_startup_timeout_naming_the_missing_worker():
    # TensorFlow's leader would wait an hour in its device barrier, whatever the timeout
    spec = ClusterSpec.local(workers=2, task_type="worker", task_index=0)
    started = time.monotonic()
    proc = _start(spec, timeout=6)
    output = proc.communicate(timeout=240)[0]
    assert proc.returncode == 1, output
    assert time.monotonic() - started < 120
    assert "RuntimeError: Task worker:0 could not form the multi-worker cluster" in output, output
    assert f"no answer within 6 s from worker:1 ({spec.cluster['worker'][1]})" in output
    assert "Missing tasks: worker:1. HINT: start every task of the cluster" in output


def test_an_evaluator_alone_fails_naming_every_missing_worker():
    spec = ClusterSpec.local(workers=2, evaluator=True, task_type="evaluator", task_index=0)
    proc = _start(spec, timeout=4)
    output = proc.communicate(timeout=240)[0]
    assert proc.returncode == 1, output
    assert "Missing tasks: worker:0, worker:1. HINT:" in output, output


def test_a_parameter_server_chief_whose_servers_never_come_fails_naming_them():
    spec = ClusterSpec.local(workers=1, ps=1, chief=True, task_type="chief", task_index=0)
    proc = _start(spec, timeout=4)
    output = proc.communicate(timeout=240)[0]
    assert proc.returncode == 1, output
    assert "Task chief:0 could not connect to the parameter-server cluster" in output, output
    assert "Missing tasks: worker:0, ps:0. HINT:" in output


def test_a_parameter_server_chief_ends_at_once_on_sigterm():
    spec = ClusterSpec.local(workers=1, ps=1, chief=True, task_type="chief", task_index=0)
    proc = _start(spec)
    _wait_for_the_wait(proc)
    seconds, output = _signal_and_time(proc, signal.SIGTERM)
    assert seconds < 5 and proc.returncode != 0, output
    assert "tfdist: task chief:0 received SIGTERM while it waited for its peers" in output


def _fake_peer(address):
    """A listener that answers tfdist's probes but is no TensorFlow task: the peer that came
    and died before it registered."""
    import socket

    host, port = address.rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    sock.listen(8)
    return sock


def _wait_for_tensorflows_wait(proc):
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "tasks to connect" in line:  # the leader's coordination service waits
            return
    raise AssertionError("TensorFlow never waited:\n" + "".join(lines))


def test_tensorflows_own_wait_ends_at_once_when_the_job_is_stopped():
    spec = ClusterSpec.local(workers=2, task_type="worker", task_index=0)
    with _fake_peer(spec.cluster["worker"][1]):
        proc = _start(spec, TF_CPP_MIN_LOG_LEVEL="0")
        _wait_for_tensorflows_wait(proc)
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)  # as the launcher stops a task: its whole group
        output = proc.communicate(timeout=30)[0]
    assert time.monotonic() - started < 5, output
    assert proc.returncode == -signal.SIGKILL
    assert "tfdist: task worker:0 received SIGTERM while TensorFlow waited for its peers" in output


def test_tensorflows_own_wait_is_bounded():
    # the leader would wait an hour in its device barrier for a peer that never registers
    spec = ClusterSpec.local(workers=2, task_type="worker", task_index=0)
    started = time.monotonic()
    with _fake_peer(spec.cluster["worker"][1]):
        proc = _start(spec, timeout=3)
        output = proc.communicate(timeout=240)[0]
    assert proc.returncode != 0, output
    assert time.monotonic() - started < 150
    assert "tfdist: task worker:0 was still waiting after 36 s while TensorFlow waited" in output


# ------------------------------------------------------------ the wait itself, in process


def test_wait_for_peers_returns_once_every_peer_answered(free_ports):
    spec = ClusterSpec.local(workers=3, task_type="worker", task_index=0)
    answered = []

    def probe(address, timeout):
        answered.append(address)
        return answered.count(address) >= 2  # each peer answers at its second probe

    peers.wait_for_peers(
        spec, [("worker", 1), ("worker", 2)], 30, purpose="test", listen=False, probe=probe
    )
    assert sorted(set(answered)) == sorted(spec.cluster["worker"][1:])


def test_a_waiting_task_answers_its_peers_probes_on_its_own_port():
    spec = ClusterSpec.local(workers=2, task_type="worker", task_index=0)
    seen = []

    def probe(address, timeout):  # the peer probes this task's port while it waits
        seen.append(peers.answers(spec.cluster["worker"][0], 1.0))
        return True

    peers.wait_for_peers(spec, [("worker", 1)], 30, purpose="test", probe=probe)
    assert seen == [True]
    assert not peers.answers(spec.cluster["worker"][0], 1.0)  # closed: TensorFlow binds it next
