"""Multi-node jobs (`tfdist launch --nodes N --node-rank R --rendezvous HOST:PORT`), with each
node a launcher process of its own at its own loopback address (127.0.0.1, 127.0.0.2, ...;
Linux routes all of 127.0.0.0/8 to the loopback device).

- 2 nodes x 2 workers train as one multi_worker_mirrored job of 4 replicas; a node with another
  script and a connection with a wrong token are refused on the way, and the job goes on; the
  token reaches no task.
- A node's launcher SIGKILLed mid-training: its tasks end with it, the other node stops its
  own, and the job restarts on both once the node is started again, with final weights equal
  to an uninterrupted run's.
- A node whose rendezvous never starts gives up after --rendezvous-timeout, naming the address.
- 3 nodes run a parameter-server job: the chief on node 0, a worker and a ps on each node; their
  number and ranks from SLURM_NNODES and SLURM_NODEID, as under `srun --ntasks-per-node=1`.
- A task preempted on one node, in a job that sums through Gloo: every task saves at the same
  step, and the job restarts on both nodes without counting, to final weights equal to an
  uninterrupted run's.
- `--nodes 2:3`: the job grows when a third node joins and goes on without it once it is lost.
"""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tfdist.cluster.spec import free_ports
from tfdist.launcher import launch
from tfdist.launcher.rendezvous import Client, RendezvousError
from tfdist.testing import is_running

from helpers.paths import SCRIPTS

pytestmark = pytest.mark.slow

TOKEN = "the-job-token"
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TFDIST_RENDEZVOUS_TOKEN": TOKEN}


class _Node:
    """One node: `tfdist launch --nodes ...` at 127.0.0.(rank + 1), its output in a file."""

    def __init__(self, tmp, rank, nodes, port, script, args, *flags, slurm=False, elastic=False):
        """`slurm`: --nodes and --node-rank left out, taken from SLURM_NNODES and SLURM_NODEID
        (as `srun --ntasks-per-node=1 tfdist launch ...` sets them on each node); `elastic`:
        --nodes is in `flags`."""
        self.log = tmp / f"node{rank}-{time.monotonic_ns()}.log"
        env = dict(os.environ, **ENV)
        if slurm:
            env.update(SLURM_NNODES=str(nodes), SLURM_NODEID=str(rank))
            where = []
        elif elastic:
            where = ["--node-rank", str(rank)]
        else:
            where = ["--nodes", str(nodes), "--node-rank", str(rank)]
        command = [
            sys.executable, "-m", "tfdist", "launch", *where,
            "--rendezvous", f"127.0.0.1:{port}", "--node-address", f"127.0.0.{rank + 1}",
            "--rendezvous-timeout", "120", *flags, str(script), *map(str, args),
        ]  # fmt: skip
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)

    def text(self):
        return self.log.read_text()

    def wait(self, seconds=300):
        try:
            return self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the node did not end in {seconds} s:\n{self.text()}") from None

    def wait_for(self, text, seconds=120):
        deadline = time.monotonic() + seconds
        while text not in self.text():
            assert time.monotonic() < deadline, f"{text!r} not seen:\n{self.text()}"
            time.sleep(0.2)


def _ended(nodes):
    """Each node's exit code, once all have ended (any still running at a failure: killed)."""
    try:
        return [node.wait() for node in nodes]
    finally:
        for node in nodes:
            if node.proc.poll() is None:
                node.proc.kill()


def _descendants(pid):
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def test_two_nodes_of_two_workers_are_one_job_and_strangers_are_refused(tmp_path):
    (port,) = free_ports(1)
    script = os.path.join(SCRIPTS, "nodes_report.py")
    node0 = _Node(tmp_path, 0, 2, port, script, [tmp_path], "--workers-per-node", "2")
    try:
        node0.wait_for("node 0 joined")
        # another script: refused at the rendezvous, its launcher ends with the reason
        other = tmp_path / "nodes_report.py"
        shutil.copy(script, other)
        with open(other, "a") as f:
            f.write("# changed\n")
        stranger = _Node(tmp_path, 1, 2, port, other, [tmp_path], "--workers-per-node", "2")
        assert stranger.wait(60) == 2
        assert "refused this node: it runs another script" in stranger.text()
        # a wrong token: refused, and logged by node 0
        with pytest.raises(RendezvousError, match="refused this node: a wrong token"):
            Client(
                ("127.0.0.1", port), token="guess", rank=1, nodes=2, digest="", version="",
                timeout=10,
            ).connect()  # fmt: skip
        node1 = _Node(tmp_path, 1, 2, port, script, [tmp_path], "--workers-per-node", "2")
        assert (node0.wait(), node1.wait()) == (0, 0), node0.text() + node1.text()
    finally:
        if node0.proc.poll() is None:
            node0.proc.kill()
    assert "The rendezvous refused 127.0.0.1" in node0.text()
    assert ": a wrong token" in node0.text()
    reports = {
        name: json.loads((tmp_path / f"worker-{name}.json").read_text()) for name in range(4)
    }
    assert {r["replicas"] for r in reports.values()} == {4}
    cluster = reports[0]["TF_CONFIG"]["cluster"]["worker"]
    assert [address.split(":")[0] for address in cluster] == ["127.0.0.1"] * 2 + ["127.0.0.2"] * 2
    assert len({r["weights"] for r in reports.values()}) == 1  # one model, in sync
    assert not any(r["token_seen"] for r in reports.values())
    assert TOKEN not in node0.text() + node1.text()
    for text in (node0.text(), node1.text()):
        assert "The job ended done" in text
        assert "its tasks listen on every interface of this host" in text


def test_a_killed_node_comes_back_and_every_node_restarts_from_the_backup(tmp_path):
    interrupted, uninterrupted = tmp_path / "interrupted", tmp_path / "uninterrupted"
    interrupted.mkdir()
    uninterrupted.mkdir()
    (port,) = free_ports(1)
    script = os.path.join(SCRIPTS, "train_backup.py")
    args = [interrupted, "--step-seconds", "0.2"]
    flags = ("--workers-per-node", "1", "--max-restarts", "1")
    node0 = _Node(tmp_path, 0, 2, port, script, args, *flags)
    node1 = _Node(tmp_path, 1, 2, port, script, args, *flags)
    try:
        deadline = time.monotonic() + 180
        epochs = interrupted / "epochs.log"
        while not (epochs.exists() and epochs.read_text()):  # epoch 1 of 3 is done
            assert time.monotonic() < deadline and node0.proc.poll() is None, node0.text()
            time.sleep(0.1)
        tasks = _descendants(node1.proc.pid)
        assert tasks
        node1.proc.send_signal(signal.SIGKILL)
        node1.proc.wait()
        deadline = time.monotonic() + 15
        while any(is_running(p) for p in tasks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in tasks if is_running(p)], "a task outlived its node's launcher"
        node0.wait_for("Restarting the job on every node (restart 1/1)", 120)
        node1 = _Node(tmp_path, 1, 2, port, script, args, *flags)
        assert (node0.wait(), node1.wait()) == (0, 0), node0.text() + node1.text()
    finally:
        for node in (node0, node1):
            if node.proc.poll() is None:
                node.proc.kill()
    assert "node 1 was lost" in node0.text()
    assert [line.split()[0] for line in epochs.read_text().splitlines()] == ["0", "1", "2"]
    launch(
        script,
        [str(uninterrupted)],
        workers=2,
        timeout=300,
        extra_env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        quiet=True,
        check=True,
    )
    resumed = np.load(interrupted / "final.npz")
    reference = np.load(uninterrupted / "final.npz")
    for key in reference.files:
        np.testing.assert_allclose(resumed[key], reference[key], atol=1e-5)


def test_three_nodes_of_a_slurm_allocation_run_a_parameter_server_job(tmp_path):
    (port,) = free_ports(1)
    script = os.path.join(SCRIPTS, "ps_train.py")
    flags = ("--workers-per-node", "1", "--ps-per-node", "1")
    nodes = [
        _Node(tmp_path, rank, 3, port, script, [tmp_path, 1], *flags, slurm=True)
        for rank in range(3)
    ]
    codes = _ended(nodes)
    assert codes == [0, 0, 0], "".join(node.text() for node in nodes)
    result = json.loads((tmp_path / "result.json").read_text())
    assert (result["task"], result["workers"]) == ("chief:0", 3)
    assert result["iterations"] == result["steps_per_epoch"]  # every scheduled step, once
    config = json.loads(json.loads((tmp_path / "chief-0.started").read_text())["TF_CONFIG"])
    hosts = {
        job: [address.split(":")[0] for address in addresses]
        for job, addresses in config["cluster"].items()
    }
    assert hosts == {
        "chief": ["127.0.0.1"],
        "worker": ["127.0.0.1", "127.0.0.2", "127.0.0.3"],
        "ps": ["127.0.0.1", "127.0.0.2", "127.0.0.3"],
    }


def test_an_elastic_job_grows_when_a_node_joins_and_goes_on_without_a_lost_one(tmp_path):
    """--nodes 2:3: it starts on nodes 0 and 1 (node 2 is not there); node 2 joins in epoch 2
    of 3, and every task saves at the same step and starts again on 3 nodes from the backup;
    node 2's launcher is then killed for good, and the others go on without it. Every epoch
    finishes exactly once; no restart is counted."""
    out = tmp_path / "out"
    out.mkdir()
    (port,) = free_ports(1)
    script = os.path.join(SCRIPTS, "train_backup.py")
    args = [out, "--step-seconds", "0.4"]
    flags = ("--workers-per-node", "1", "--nodes", "2:3")
    nodes = [_Node(tmp_path, r, None, port, script, args, *flags, elastic=True) for r in (0, 1)]
    epochs = out / "epochs.log"

    def wait_for_epochs(count):
        deadline = time.monotonic() + 240
        while not (epochs.exists() and len(epochs.read_text().splitlines()) >= count):
            assert time.monotonic() < deadline and nodes[0].proc.poll() is None, nodes[0].text()
            time.sleep(0.1)

    try:
        wait_for_epochs(1)
        nodes.append(_Node(tmp_path, 2, None, port, script, args, *flags, elastic=True))
        nodes[0].wait_for("node 2 joined: the job grows to 3 nodes", 60)
        nodes[0].wait_for("Starting on 3 nodes", 60)
        wait_for_epochs(2)  # epoch 2 trained on 3 nodes; epoch 3 takes 12 x 0.4 s
        nodes[2].proc.send_signal(signal.SIGKILL)
        nodes[0].wait_for("node 2 was lost", 60)
        assert (nodes[0].wait(), nodes[1].wait()) == (0, 0), nodes[0].text() + nodes[1].text()
    finally:
        for node in nodes:
            if node.proc.poll() is None:
                node.proc.kill()
    text = nodes[0].text()
    assert [line.split()[0] for line in epochs.read_text().splitlines()] == ["0", "1", "2"]
    assert text.count("Starting on 2 nodes (2:3).") == 2, text
    assert "restart 1/" not in text and "The job ended done" in text
    assert "[worker:2]" in nodes[2].text()  # node 2 ran its worker in the job


def test_a_preempted_task_restarts_every_node_without_counting(tmp_path):
    """SIGTERM to worker 1 (on node 1) at step 15 of a job that sums through Gloo between the
    nodes' addresses (--communication gloo; TensorFlow's ring where the gloo extra is not
    installed): every task saves at the same step and exits with 143, and the nodes start
    again together, not counted (--max-restarts 0), resuming at that step: final weights equal
    an uninterrupted local run's on TensorFlow's ring."""
    out, backup = tmp_path / "out", tmp_path / "backup"
    out.mkdir()
    (port,) = free_ports(1)
    script = os.path.join(SCRIPTS, "preempt_fit.py")
    args = [out, backup, "--api", "tfdist", "--signal", "worker:1:15"]
    gloo = importlib.util.find_spec("torch") is not None  # the gloo extra; else the ring
    flags = ["--workers-per-node", "1", "--communication", "gloo" if gloo else "ring"]
    nodes = [_Node(tmp_path, r, 2, port, script, args, *flags) for r in (0, 1)]
    codes = _ended(nodes)
    text = nodes[0].text()
    assert codes == [0, 0], text + nodes[1].text()
    assert "after a preemption, not counted against --max-restarts" in text
    assert "worker:0   preempted (143)" in text
    assert "worker:1   preempted (143)" in nodes[1].text()

    reference = tmp_path / "reference"
    reference.mkdir()
    launch(
        script,
        [str(reference), str(tmp_path / "reference-backup"), "--api", "tfdist"],
        workers=2,
        timeout=300,
        extra_env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        quiet=True,
        check=True,
    )
    for task in ("worker-0", "worker-1"):
        resumed = json.loads((out / f"{task}.json").read_text())
        expected = json.loads((reference / f"{task}.json").read_text())
        assert resumed["gloo"] == gloo and not expected["gloo"]  # the reference: the ring
        assert resumed["iterations"] == expected["iterations"]
        for got, want in zip(resumed["weights"], expected["weights"]):
            np.testing.assert_allclose(got, want, atol=1e-6)


def test_a_node_whose_rendezvous_never_starts_gives_up_naming_the_address(tmp_path):
    (port,) = free_ports(1)
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable, "-m", "tfdist", "launch", "--nodes", "2", "--node-rank", "1",
            "--rendezvous", f"127.0.0.1:{port}", "--rendezvous-timeout", "3",
            os.path.join(SCRIPTS, "nodes_report.py"), str(tmp_path),
        ],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, **ENV),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"No rendezvous answered at 127.0.0.1:{port} within 3 s" in proc.stderr
    assert "HINT: start node 0" in proc.stderr
    assert time.monotonic() - started < 60
