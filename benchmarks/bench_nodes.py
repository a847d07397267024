"""What a job across nodes costs against the same job on one machine: start-up, and the time from
a lost node to training again.

Each node is a `tfdist launch --nodes 2 --node-rank R --rendezvous ...` process of its own at its
own loopback address (127.0.0.1, 127.0.0.2), on this one host; the alternative is one local
`tfdist launch` of the same tasks. The job's script is this file (`--side`): it makes the
strategy (multi_worker_mirrored), all-reduces once, prints the wall time at which it trains,
then all-reduces every 0.2 s until it has run `--seconds`.

- **start-up**: seconds from starting the launchers to every task training (4 workers: 2 nodes
  x 2 against `--workers 4`).
- **failure to restart**: 2 workers, `--max-restarts 1`. Across nodes: SIGKILL to node 1's
  launcher, which is started again at once (as a supervisor would); locally: SIGKILL to worker
  1. Seconds from the kill to every task training again (fresh processes, fresh ports). Across
  nodes this takes the rendezvous seeing the node gone, node 0 stopping its task, node 1's
  launcher joining again, and both starting afresh.

Rounds alternate the two sides; rows give medians over rounds (lower is better). Run with the
host otherwise idle: process start-up dominates both sides.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

THIS = os.path.abspath(__file__)
TOKEN = "bench-nodes-token"
TRAINING = re.compile(r"\[(worker:\d+)\] training at (\d+\.\d+)")


def _side(seconds: float) -> None:
    import tensorflow as tf

    import tfdist

    strategy = tfdist.make_strategy()
    one = tf.constant(1.0)

    def all_reduce():
        return strategy.reduce("SUM", strategy.run(lambda: tf.identity(one)), axis=None)

    all_reduce()
    print(f"training at {time.time():.3f}", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        all_reduce()
        time.sleep(0.2)


def _launcher(log, *flags, rank=None, port=None, seconds=0.0, env=None):
    where = (
        []
        if rank is None
        else [
            "--nodes", "2", "--node-rank", str(rank), "--rendezvous", f"127.0.0.1:{port}",
            "--node-address", f"127.0.0.{rank + 1}",
        ]
    )  # fmt: skip
    command = [sys.executable, "-m", "tfdist", "launch", *where, *flags, THIS, "--side"]
    command.append(str(seconds))
    environment = dict(os.environ, TFDIST_RENDEZVOUS_TOKEN=TOKEN, **(env or {}))
    out = open(log, "a")
    return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=environment)


def _training(logs, after=0.0):
    """{task: the first time it trained after `after`} from the launchers' logs."""
    found = {}
    for log in logs:
        with open(log) as f:
            for task, at in TRAINING.findall(f.read()):
                if float(at) > after:
                    found.setdefault(task, float(at))
    return found


def _wait_training(logs, tasks, after, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _training(logs, after)
        if len(found) >= tasks:
            return max(found.values())
        time.sleep(0.05)
    raise RuntimeError(f"{tasks} tasks did not train within {timeout} s: {logs}")


def _stop(procs):
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _startup(folder, nodes: bool) -> float:
    from tfdist.cluster.spec import free_ports

    logs = [os.path.join(folder, f"start-{time.monotonic_ns()}-{r}.log") for r in (0, 1)]
    started = time.time()
    if nodes:
        (port,) = free_ports(1)
        procs = [_launcher(logs[r], "--workers-per-node", "2", rank=r, port=port) for r in (0, 1)]
    else:
        procs, logs = [_launcher(logs[0], "--workers", "4")], logs[:1]
    try:
        return _wait_training(logs, 4, started) - started
    finally:
        _stop(procs)


def _restart(folder, nodes: bool) -> float:
    from tfdist.cluster.spec import free_ports

    logs = [os.path.join(folder, f"restart-{time.monotonic_ns()}-{r}.log") for r in (0, 1)]
    flags = ("--max-restarts", "1")
    started = time.time()
    if nodes:
        (port,) = free_ports(1)
        procs = [
            _launcher(logs[r], *flags, "--workers-per-node", "1", rank=r, port=port, seconds=120)
            for r in (0, 1)
        ]
    else:
        procs, logs = [_launcher(logs[0], *flags, "--workers", "2", seconds=120)], logs[:1]
    try:
        _wait_training(logs, 2, started)
        time.sleep(1.0)
        killed = time.time()
        if nodes:
            procs[1].kill()
            procs[1].wait()
            procs.append(
                _launcher(
                    logs[1], *flags, "--workers-per-node", "1", rank=1, port=port, seconds=120
                )
            )
        else:
            worker = _worker_pid(procs[0].pid, "worker:1")
            os.kill(worker, signal.SIGKILL)
        return _wait_training(logs, 2, killed) - killed
    finally:
        _stop(procs)


def _worker_pid(launcher: int, task: str) -> int:
    """The pid of the process that runs `task` (its TFDIST_TASK), below `launcher`."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if f"TFDIST_TASK={task}".encode() in environ and b"--side" in cmdline:
            if b"keeper" not in cmdline:
                return int(entry)
    raise RuntimeError(f"no process of {task} below {launcher}")


def run(quick: bool) -> list:
    rounds = 2 if quick else 5
    samples = {"startup": ([], []), "restart": ([], [])}
    with tempfile.TemporaryDirectory(prefix="tfdist-bench-nodes-") as folder:
        try:
            for index in range(rounds):
                for nodes in (index % 2 == 0, index % 2 == 1):  # alternate which goes first
                    samples["startup"][0 if nodes else 1].append(_startup(folder, nodes))
                    samples["restart"][0 if nodes else 1].append(_restart(folder, nodes))
        except Exception as err:  # pylint: disable=broad-except
            return [common.error_row("multi-node jobs", repr(err)[:500])]
    return [
        common.row(
            "start-up to training, 4 workers: 2 nodes x 2 (rendezvous)",
            *samples["startup"],
            "one machine, --workers 4",
            "s",
            higher_is_better=False,
        ),
        common.row(
            "SIGKILL to training again, 2 workers: node 1's launcher, started again at once",
            *samples["restart"],
            "one machine, worker 1 killed",
            "s",
            higher_is_better=False,
        ),
    ]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--side"]:
        _side(float(sys.argv[2]))
    else:
        common.print_table(run("--quick" in sys.argv))
