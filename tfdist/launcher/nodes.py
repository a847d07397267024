"""A job across several machines without a scheduler: `launch_nodes`, one node's side of
`tfdist launch --nodes N --node-rank R --rendezvous HOST:PORT --workers-per-node K train.py`.

Every node runs the same command with its own rank. Node 0 also hosts the rendezvous
(`tfdist.launcher.rendezvous`), where each node proves the job's token and says where its tasks
will listen (its address and fresh ports); the rendezvous lays out one cluster and each node's
launcher starts its own tasks with their TF_CONFIG (`plan_job(only=...)`, `run_job`), in the
host's network (other nodes must reach them). A task that fails, or a node that is lost, stops
every node's tasks (`run_job`'s `stop_when`); the nodes then start again together, on fresh
ports, from the job's backup, as a local job does (counted against `max_restarts`; a
preemption, where every task saved and exited with 143, is not).

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import secrets
import sys
from typing import Mapping, Optional, Sequence, TextIO

from tfdist import gpus as gpu_lib
from tfdist import settings
from tfdist.cluster import ClusterSpec
from tfdist.cluster.spec import free_ports
from tfdist.errors import is_count
from tfdist.launcher.job import check_grace, check_timeout, plan_job, run_job
from tfdist.launcher.outcome import GRACE_SECONDS, JobResult, first_failure, summary
from tfdist.launcher.rendezvous import Client, Server, parse_address, script_digest

__all__ = ["launch_nodes"]

# Said once by every node's launcher: a multi-node job cannot be loopback-only.
EXPOSED = (
    "This is a multi-node job: its tasks listen on every interface of this host (TensorFlow "
    "binds 0.0.0.0:PORT), and node 0's rendezvous on {rendezvous}. Let only the job's nodes "
    "reach these ports (see docs/multi-node.md, 'Firewalls')."
)


def launch_nodes(
    target: str,
    args: Sequence[str] = (),
    *,
    nodes,
    node_rank: int,
    rendezvous: str,
    workers_per_node: int = 1,
    ps_per_node: int = 0,
    token: Optional[str] = None,
    node_address: Optional[str] = None,
    module: bool = False,
    max_restarts: int = 0,
    timeout: Optional[float] = None,
    grace: float = GRACE_SECONDS,
    rendezvous_timeout: Optional[float] = None,
    log_dir: Optional[str] = None,
    extra_env: Optional[Mapping[str, str]] = None,
    quiet: bool = False,
    out: Optional[TextIO] = None,
    verbose: Optional[bool] = None,
    gpus_per_worker=gpu_lib.AUTO,
) -> JobResult:
    """Runs this node's part of a multi-node job until the job ends; the twin of `tfdist launch
    --nodes`.

    Args:
        target / args / module: the script, the same on every node (the rendezvous refuses a
            node whose script or arguments differ).
        nodes: int. The nodes of the job, each a launcher with its own `node_rank`. A pair
            (MIN, MAX): an elastic job, which starts once MIN nodes joined (node 0 among them)
            and the others had `rendezvous.ELASTIC_WINDOW` seconds more, goes on without a node
            that is lost and not back within that window (not counted against
            `max_restarts`), and grows when a node joins later: every task saves at the same
            step (SIGTERM, as at a preemption) and all start again with it, from the backup.
        node_rank: int. 0 .. nodes - 1 (MAX - 1); node 0 hosts the rendezvous.
        rendezvous: str. "HOST:PORT", node 0's address and a free port there, the same on every
            node.
        workers_per_node / ps_per_node: the tasks each node runs ("gpu": one worker per
            `gpus_per_worker` GPUs). A parameter-server job's chief runs on node 0.
        token: str. The job's secret. Defaults to TFDIST_RENDEZVOUS_TOKEN; node 0 makes one
            where neither is given, and prints it for the others.
        node_address: str. Where the other nodes reach this one's tasks. Defaults to this
            host's address on the way to the rendezvous.
        max_restarts: int. Restarts of the whole job after a failure anywhere.
        rendezvous_timeout: float. Seconds to wait for the rendezvous, and for every node to
            join (again). Defaults to TFDIST_RENDEZVOUS_TIMEOUT (300).
        The others: as `tfdist.launch`.

    Returns:
        JobResult: this node's tasks in the job's last attempt, with the job's reason.

    Raises:
        ValueError: a bad argument, or no token on a node other than 0.
        RendezvousError: the rendezvous cannot be reached, or refused this node.
    """
    out = out or sys.stdout
    _check(nodes, node_rank, workers_per_node, ps_per_node)
    address = parse_address(rendezvous)
    timeout, grace = check_timeout(timeout), check_grace(grace)
    waited = settings.RENDEZVOUS_TIMEOUT.get() if rendezvous_timeout is None else rendezvous_timeout
    waited = check_timeout(waited)

    def say(text: str) -> None:
        out.write(f"[tfdist] {text}\n")
        out.flush()

    token = token or settings.RENDEZVOUS_TOKEN.get()
    if not token:
        if node_rank != 0:
            raise ValueError(
                f"Node {node_rank} has no token for the rendezvous at {rendezvous}. HINT: give "
                "every node the token node 0 printed: --token TOKEN, or TFDIST_RENDEZVOUS_TOKEN "
                "in its environment."
            )
        token = secrets.token_urlsafe(24)
        say(
            "The job's token (give it to every other node: --token, or TFDIST_RENDEZVOUS_TOKEN; "
            f"it is not passed to any task): {token}"
        )
    if workers_per_node == "gpu":
        workers_per_node = gpu_lib.worker_count(
            gpu_lib.visible(), gpu_lib.per_worker(gpus_per_worker)
        )
    # what the rendezvous and every node hold alike
    job = dict(
        token=token,
        nodes=nodes,
        digest=script_digest(target, args, module),
        version=_version(),
        timeout=waited,
    )
    server = None
    if node_rank == 0:
        server = Server(
            (_listen_host(address[0]), address[1]),
            max_restarts=max_restarts,
            grace=grace,
            say=say,
            **job,
        ).start()
    say(EXPOSED.format(rendezvous=rendezvous))
    client = Client(address, rank=node_rank, source=node_address, ps=ps_per_node, **job)
    node = _Node(
        client,
        dict(
            target=target,
            args=args,
            module=module,
            # in the host's network by choice (said once above): no warning from each task
            extra_env={settings.NETWORK_NAMESPACE.name: "off", **(extra_env or {})},
            gpus_per_worker=gpu_lib.per_worker(gpus_per_worker),
        ),
        run=dict(
            timeout=timeout,
            grace=grace,
            out=out,
            log_dir=log_dir,
            quiet=quiet,
            verbose=settings.VERBOSE.get() if verbose is None else bool(verbose),
        ),
        tasks=(workers_per_node, ps_per_node),
        host=node_address,
        waited=waited,
        say=say,
    )
    try:
        return node.run()
    finally:
        client.close()
        if server is not None:
            server.close()


def _version() -> str:
    """This tfdist's version, as installed (every node must run the same)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("tfdist")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _check(nodes, node_rank, workers_per_node, ps_per_node) -> None:
    pair = isinstance(nodes, (tuple, list))
    if not (
        (pair and len(nodes) == 2 and all(is_count(n, 1) for n in nodes) and nodes[0] <= nodes[1])
        or (not pair and is_count(nodes, 1))
    ):
        raise ValueError(
            f"--nodes must be a whole number >= 1, or MIN:MAX with 1 <= MIN <= MAX. Received: "
            f"{nodes!r}. HINT: e.g. --nodes 2 on each of two machines, or --nodes 2:3 for a "
            "job that starts on 2 and takes a third when it joins."
        )
    high = nodes[1] if pair else nodes
    if not is_count(node_rank) or node_rank >= high:
        raise ValueError(
            f"--node-rank must be one of 0..{high - 1} (--nodes {nodes}). Received: "
            f"{node_rank!r}. HINT: give each node its own rank; node 0 hosts the rendezvous."
        )
    if workers_per_node != "gpu" and not is_count(workers_per_node, 1):
        raise ValueError(
            f"--workers-per-node must be a whole number >= 1, or gpu. Received: "
            f"{workers_per_node!r}. HINT: e.g. --workers-per-node 2."
        )
    if not is_count(ps_per_node):
        raise ValueError(
            f"--ps-per-node must be a whole number >= 0. Received: {ps_per_node!r}. HINT: e.g. "
            "--ps-per-node 1 for a parameter-server job."
        )


def _listen_host(host: str) -> str:
    """Where node 0's rendezvous listens: the address it was given, where that is an address;
    every interface where it is a name (a host's own name may resolve to a loopback address
    here, e.g. 127.0.1.1 in /etc/hosts, where the other nodes cannot reach it)."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        return ""


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class _Node:
    """One node's attempts: ready, start, run, report, until the rendezvous says finish."""

    def __init__(self, client: Client, plan: dict, *, run: dict, tasks, host, waited, say):
        self.client, self.plan, self.run_args = client, plan, run
        self.workers, self.ps = tasks
        self.host, self.waited, self.say = host, waited, say
        self.result: Optional[JobResult] = None
        self.attempts = 0

    def run(self) -> JobResult:
        self.client.connect()
        host = self.host or self.client.local_host()
        if _is_loopback(host) and not _is_loopback(self.client.address[0]):
            self.say(
                f"WARNING: this node's tasks would be reached at {host}, a loopback address, "
                f"which other machines cannot reach (the rendezvous at {self.client.where} "
                "is reached through it). HINT: give --node-address with this machine's "
                "address on the network the nodes share."
            )
        while True:
            count = self.workers + self.ps + (1 if self.client.rank == 0 and self.ps else 0)
            self.client.ready(host, free_ports(count), self.workers, self.ps)
            # "again": the job restarted while this node waited to join it (an elastic job)
            message = self.client.wait(("start", "finish", "again"), self.waited + 60)
            if message["op"] == "start":
                message = self._attempt(message)
                if message is None:  # this launcher itself was stopped
                    return self.result
            if message["op"] == "finish":
                return self._finish(message)
            if message["op"] == "lost":
                self._reconnect()

    def _attempt(self, start: dict) -> Optional[dict]:
        """Runs this node's tasks once; the rendezvous's next word ("again", "finish", "lost"),
        or None when this launcher got SIGINT or SIGTERM (it leaves the job)."""
        self.attempts += 1
        cluster = ClusterSpec(start["cluster"])
        plans = plan_job(cluster=cluster, only=start["tasks"], **self.plan)
        result = run_job(
            plans, stop_when=self.client.stop_reason, private_network=False, **self.run_args
        )
        stopped = result.reason == self.client.stop
        if result.launcher_signal:
            reason = "preempted" if result.saved else "interrupted"
        elif any(t.not_restartable for t in result.tasks.values()):
            reason = "not_restartable"
        else:
            reason = "stopped" if stopped else result.reason
        failure = first_failure(result)
        self.client.send(
            "ended",
            round=start["round"],
            reason=reason,
            failure=f"{failure.task} exited with code {failure.returncode}" if failure else "",
        )
        self.result = dataclasses.replace(result, restarts=self.attempts - 1)
        if not self.run_args["quiet"]:
            self.run_args["out"].write(summary(self.result))
        if stopped:
            self.say(f"Stopped this node's tasks: {self.client.stop}.")
        if result.launcher_signal:
            return None
        # no bound of its own: the others may train on for long (the chief's final export);
        # a rendezvous that is gone or silent ends the wait ("lost") after PEER_TIMEOUT
        return self.client.wait(("again", "finish"))

    def _reconnect(self) -> None:
        self.say(
            f"Lost the rendezvous at {self.client.where}; trying again for at most "
            f"{self.waited:g} s."
        )
        self.client.lost = True
        self.client.close()
        self.client.connect()

    def _finish(self, message: dict) -> JobResult:
        reason = message["reason"]
        self.say(f"The job ended {reason}: {message['message']}")
        result = self.result or JobResult(reason, {})
        return dataclasses.replace(result, reason=reason, restarts=self.client.restarts)
