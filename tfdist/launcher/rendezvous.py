"""The rendezvous of a multi-node job: the nodes that prove the job's token agree on one cluster,
and then on every stop and restart of the job.

One `Server` runs in the launcher of node 0, at the address every node is given
(`--rendezvous HOST:PORT`); each node's launcher is a `Client` with one TCP connection to it for
the whole job. Messages are JSON objects, one per line, each with an "op":

    server -> node: challenge {nonce}   welcome {round, restarts}   refused {why}
                    start {round, cluster, tasks}   stop {round, why}
                    again {round, restarts, why}    finish {reason, message}   beat
    node -> server: join {rank, proof, nodes, digest, version, restarts}
                    ready {round, host, ports}   ended {round, reason, failure}   beat

- **The token never crosses the network**: the server sends a random nonce, the node answers
  with HMAC-SHA256(token, nonce). A wrong proof, another script (`digest`: the script's bytes and
  arguments), another tfdist version, another number of nodes, or a rank already in the job is
  refused, and logged by the server; the job goes on.
- **One cluster**: when every node is `ready` (its address and fresh ports), the server lays
  out the cluster in rank order (a parameter-server job's chief is node 0's first port) and
  sends each node the cluster and its own tasks.
- **Failures are job-wide**: a node that reports a failed, preempted or interrupted attempt,
  or whose connection ends or falls silent for `PEER_TIMEOUT` seconds, makes the server send
  every node `stop`; once each has `ended` (or is gone), the server sends `again` (the next
  round: every node comes back `ready` with fresh ports, within the rendezvous timeout) or
  `finish`. A failure counts against `max_restarts`; a preemption (every task saved, exit 143)
  does not.
- **Elastic jobs** (`nodes=(MIN, MAX)`): the job starts once node 0 and MIN - 1 others are
  ready and `ELASTIC_WINDOW` seconds more have passed (all MAX start at once); a node that joins
  the running job stops every node (its tasks get SIGTERM: they save as at a preemption) and the
  next round takes it in; a lost node that is not back within the window is left out while MIN
  remain. Neither counts against `max_restarts`.
- **Every wait is bounded**: a node gives up after `timeout` seconds without a rendezvous that
  answers; the server after `timeout` seconds without every node; both sides beat every `BEAT`
  seconds and take `PEER_TIMEOUT` seconds of silence for a lost peer.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import queue
import secrets
import select
import socket
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

__all__ = [
    "BEAT",
    "PEER_TIMEOUT",
    "Client",
    "RendezvousError",
    "Server",
    "parse_address",
    "script_digest",
]

BEAT = 2.0  # seconds between two beats on an idle connection
PEER_TIMEOUT = 15.0  # seconds of silence after which the peer is taken as gone
JOIN_TIMEOUT = 10.0  # seconds a connection gets to answer the challenge
# How a node's attempt ended that ends the job, not restarted (as a local job's launcher does).
FINAL = {
    "timeout": "the job's --timeout passed",
    "interrupted": "its launcher was interrupted (SIGINT or SIGTERM) before its tasks saved",
    "not_restartable": "a task would fail the same way again",
}
# An elastic job (nodes MIN:MAX): once MIN nodes are ready, seconds to wait for the others.
ELASTIC_WINDOW = 10.0
MAX_LINE = 1 << 20  # bytes of one message, at most


class RendezvousError(RuntimeError):
    """The rendezvous cannot be reached, refused this node, or ended the job."""


def parse_address(text: str) -> Tuple[str, int]:
    """("host", port) of "HOST:PORT".

    Raises:
        ValueError: quoting the text, with the fix.
    """
    host, _, port = str(text).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"--rendezvous must be HOST:PORT, the address of node 0 and a free port there. "
            f"Received: {text!r}. HINT: e.g. --rendezvous 10.0.0.1:29400 on every node."
        )
    return host.strip("[]"), int(port)


def script_digest(target: str, args, module: bool) -> str:
    """What every node must run the same: the script's bytes (or the module's name) and its
    arguments."""
    digest = hashlib.sha256()
    if module or not os.path.isfile(target):
        digest.update(f"module:{target}".encode())
    else:
        with open(target, "rb") as f:
            digest.update(f.read())
    digest.update(json.dumps(list(args)).encode())
    return digest.hexdigest()


def _proof(token: str, nonce: str) -> str:
    return hmac.new(token.encode(), nonce.encode(), hashlib.sha256).hexdigest()


class _Line:
    """One connection that sends and receives JSON lines; `recv` raises socket.timeout after
    `timeout` seconds of silence and returns None at the end of the connection."""

    def __init__(self, sock: socket.socket):
        sock.settimeout(PEER_TIMEOUT)  # bounds a send; `recv` waits with select
        self.sock = sock
        self.buffer = b""
        self.lock = threading.Lock()
        self.closed = False

    def send(self, op: str, **fields) -> bool:
        data = (json.dumps({"op": op, **fields}) + "\n").encode()
        try:
            with self.lock:
                self.sock.sendall(data)
            return True
        except OSError:
            return False

    def recv(self, timeout: float) -> Optional[dict]:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout(f"nothing within {timeout:g} s")
            try:
                if not select.select([self.sock], [], [], left)[0]:
                    continue
                chunk = self.sock.recv(65536)
            except (OSError, ValueError):  # closed, reset, or closed by another thread
                return None
            if not chunk:
                return None
            self.buffer += chunk
            if len(self.buffer) > MAX_LINE:
                return None
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            message = json.loads(line)
        except ValueError:
            return None
        return message if isinstance(message, dict) else None

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class _Member:
    def __init__(self, rank: int, line: _Line, peer: str):
        self.rank, self.line, self.peer = rank, line, peer
        self.ready: Optional[dict] = None
        self.ended: Optional[dict] = None
        self.gone = False
        self.in_round = False  # one of the nodes the running attempt started on


def node_range(nodes) -> Tuple[int, int]:
    """(MIN, MAX) of `nodes`: N (a fixed job: (N, N)) or a pair MIN, MAX (an elastic one)."""
    if isinstance(nodes, (tuple, list)):
        return int(nodes[0]), int(nodes[1])
    return int(nodes), int(nodes)


class Server:
    """The rendezvous, in node 0's launcher: see the module's docstring.

    Args:
        address: (host, port) to listen on.
        token: str. The secret every node proves it holds.
        nodes: int, or a pair (MIN, MAX): an elastic job, which starts once MIN nodes are
            ready (and `ELASTIC_WINDOW` seconds more for the others), goes on without a node
            that is lost and not back within that window, and grows when a node joins.
        max_restarts: int. Restarts after failures before the job ends failed.
        digest / version: what every node must run.
        timeout: float. Seconds for every node to join (again).
        grace: float. Seconds the tasks get to stop; the nodes get this and a minute to report.
        say: callable. Writes a line of the launcher's own ("[tfdist] ..." is added).
    """

    def __init__(
        self,
        address: Tuple[str, int],
        *,
        token: str,
        nodes,
        max_restarts: int,
        digest: str,
        version: str,
        timeout: float,
        grace: float,
        say: Callable[[str], None],
    ):
        self.token, self.max_restarts = token, max_restarts
        self.low, self.high = node_range(nodes)
        self.elastic = self.low < self.high
        self.window_end: Optional[float] = None
        self.ps: Optional[int] = None  # ps tasks per node, from the first node that joined
        self.attempts = 0  # attempts started by this rendezvous
        self.lost_counted = False
        self.digest, self.version, self.timeout, self.grace = digest, version, timeout, grace
        self.say = say
        try:
            self.listener = socket.create_server(address, backlog=64)
        except OSError as err:
            raise RendezvousError(
                f"The rendezvous cannot listen at {address[0]}:{address[1]}: {err.strerror}. "
                "HINT: give node 0 an address of its own and a free port (--rendezvous "
                "HOST:PORT, the same on every node)."
            ) from None
        self.members: Dict[int, _Member] = {}
        self.cond = threading.Condition()
        self.round = 0
        self.restarts = self.preemptions = 0
        self.phase = "gathering"
        self.deadline = time.monotonic() + timeout
        self.stop_sent = False
        self.scripts: set = set()  # ranks whose tasks run the script, once laid out
        self.preempted_at: Optional[float] = None  # when a node first ended preempted
        self.stopped_at: Optional[float] = None
        self.why = ""
        self.outcome: Optional[Tuple[str, str]] = None  # (reason, message) once finished
        self._closing = False

    @property
    def port(self) -> int:
        return self.listener.getsockname()[1]

    def start(self) -> "Server":
        for target in (self._accept, self._coordinate):
            threading.Thread(
                target=target, daemon=True, name=f"rendezvous-{target.__name__}"
            ).start()
        return self

    def close(self) -> None:
        self._closing = True
        try:  # shutdown first: it wakes the thread in accept(), which close alone does not
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        with self.cond:
            for member in self.members.values():
                member.line.close()
            self.cond.notify_all()

    # ----------------------------------------------------------------------- connections

    def _accept(self) -> None:
        while not self._closing:
            try:
                sock, peer = self.listener.accept()
            except OSError:
                return
            threading.Thread(
                target=self._serve, args=(sock, f"{peer[0]}:{peer[1]}"), daemon=True
            ).start()

    def _refuse(self, line: _Line, peer: str, why: str, retry: bool = False) -> None:
        """Refuses a connection: for good (`retry` False: a wrong token, another script), or
        for now (the job is stopping, or the node's old connection is not yet seen gone)."""
        self.say(f"The rendezvous refused {peer}{' for now' if retry else ''}: {why}")
        line.send("refused", why=why, retry=retry)
        line.close()

    def _serve(self, sock: socket.socket, peer: str) -> None:
        line = _Line(sock)
        nonce = secrets.token_hex(16)
        line.send("challenge", nonce=nonce)
        try:
            join = line.recv(JOIN_TIMEOUT)
        except socket.timeout:
            join = None
        if not join or join.get("op") != "join":
            return self._refuse(line, peer, "it did not answer the challenge (not a tfdist node)")
        expected = _proof(self.token, nonce).encode()
        if not hmac.compare_digest(str(join.get("proof", "")).encode(), expected):
            return self._refuse(line, peer, "a wrong token")
        why = self._mismatch(join)
        if why:
            return self._refuse(line, peer, why)
        rank, retry = join["rank"], True
        with self.cond:
            old = self.members.get(rank)
            if old is not None and not old.gone:
                why = f"node {rank} is in the job already (from {old.peer})"
            elif self.phase == "finished":
                why, retry = "the job has ended", False
            elif self.phase == "running" and not self._grows():
                why = "the job is running; a node joins when it restarts"
            else:
                member = self.members[rank] = _Member(rank, line, peer)
                if self.ps is None:
                    self.ps = join.get("ps")
                self._count_lost_rendezvous(join)
                line.send(
                    "welcome",
                    round=self.round,
                    restarts=self.restarts,
                    proof=_proof(self.token, "rendezvous:" + str(join.get("nonce", ""))),
                )
                self.say(f"node {rank} joined from {peer}.")
                self.cond.notify_all()
        if why:
            return self._refuse(line, peer, why, retry)
        self._listen(member)

    def _count_lost_rendezvous(self, join: dict) -> None:
        """A node that ran attempts under an earlier rendezvous (node 0's launcher died, and
        this one replaced it) brings the job's restarts; that loss counts once."""
        known = join.get("restarts")
        if isinstance(known, int) and known >= self.restarts and join.get("lost"):
            if self.attempts == 0 and not self.lost_counted:
                self.restarts, self.lost_counted = known + 1, True
        elif isinstance(known, int):
            self.restarts = max(self.restarts, known)

    def _mismatch(self, join: dict) -> Optional[str]:
        rank = join.get("rank")
        if not isinstance(rank, int) or not 0 <= rank < self.high:
            return f"node rank {rank!r} is not one of 0..{self.high - 1}"
        try:
            theirs = node_range(join.get("nodes"))
        except (TypeError, ValueError, IndexError):
            theirs = None
        if theirs != (self.low, self.high):
            return (
                f"it was started with --nodes {_spec(theirs) if theirs else join.get('nodes')}; "
                f"the job has {_spec((self.low, self.high))}"
            )
        if self.ps is not None and join.get("ps") != self.ps:
            return (
                f"it runs --ps-per-node {join.get('ps')}; the nodes that joined before run "
                f"--ps-per-node {self.ps} (every node runs the same number of ps tasks)"
            )
        if join.get("version") != self.version:
            return f"it runs tfdist {join.get('version')}; the job runs tfdist {self.version}"
        if join.get("digest") != self.digest:
            return (
                "it runs another script or other arguments than node 0 (every node must run "
                "the same script, byte for byte, with the same arguments)"
            )
        return None

    def _listen(self, member: _Member) -> None:
        while True:
            try:
                message = member.line.recv(PEER_TIMEOUT)
            except socket.timeout:
                message = None
                if not self._closing:
                    self.say(f"node {member.rank} fell silent for {PEER_TIMEOUT:g} s.")
            with self.cond:
                if message is None:
                    member.gone = True
                    member.line.close()
                    self.cond.notify_all()
                    return
                op = message.get("op")
                if op == "ready" and message.get("round") == self.round:
                    member.ready = message
                elif op == "ended" and message.get("round") == self.round:
                    member.ended = message
                self.cond.notify_all()

    # ----------------------------------------------------------------------- the job

    def _broadcast(self, op: str, **fields) -> None:
        for member in self.members.values():
            if not member.gone:
                member.line.send(op, **fields)

    def _coordinate(self) -> None:
        last_beat = 0.0
        with self.cond:
            while self.phase != "finished" and not self._closing:
                self.cond.wait(0.25)
                now = time.monotonic()
                try:
                    if now - last_beat >= BEAT:
                        self._broadcast("beat")
                        last_beat = now
                    if self.phase == "gathering":
                        self._gather(now)
                    elif self.phase == "running":
                        self._watch(now)
                except Exception as err:  # never a rendezvous that hangs every node
                    self._finish("failed", f"the rendezvous failed: {type(err).__name__}: {err}")

    def _grows(self) -> bool:
        """Whether a node may join the running job: an elastic one, below MAX nodes."""
        present = [m for m in self.members.values() if not m.gone]
        return self.elastic and len(present) < self.high

    def _gather(self, now: float) -> None:
        ready = {r: m for r, m in self.members.items() if not m.gone and m.ready is not None}
        start = len(ready) == self.high
        if not start and self.elastic and len(ready) >= self.low and 0 in ready:
            if self.window_end is None:  # MIN are ready: the others get a window to join
                self.window_end = now + ELASTIC_WINDOW
            start = now >= self.window_end
        if start and self.restarts > self.max_restarts:
            return self._finish(
                "failed",
                f"the job was restarted {self.restarts} times (--max-restarts "
                f"{self.max_restarts}), the last after its rendezvous was lost.",
            )
        if start:
            self.attempts += 1
            cluster, tasks = _layout({r: ready[r].ready for r in sorted(ready)})
            # the nodes whose tasks run the script: the job is done when they are
            self.scripts = {r for r, names in tasks.items() if _runs_script(names, cluster)}
            for member in self.members.values():
                member.in_round = member.rank in ready and not member.gone
            for rank, member in ready.items():
                member.line.send("start", round=self.round, cluster=cluster, tasks=tasks[rank])
            if self.elastic:
                self.say(f"Starting on {len(ready)} nodes ({_spec((self.low, self.high))}).")
            self.phase, self.stop_sent, self.why, self.window_end = "running", False, "", None
            self.preempted_at = None
            return
        if now > self.deadline:
            missing = [r for r in range(self.high) if r not in ready]
            if self.elastic:
                missing = missing[: max(1, self.low - len(ready))] if 0 in ready else [0]
            self._finish(
                "failed",
                f"node{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did not "
                f"join the rendezvous within {self.timeout:g} s. HINT: start `tfdist launch "
                "--nodes ... --node-rank R` on every node with the same --rendezvous and token; "
                "--rendezvous-timeout waits longer.",
            )

    def _watch(self, now: float) -> None:
        members = [m for m in self.members.values() if m.in_round]
        lost = [m for m in members if m.gone and m.ended is None]
        bad = [m for m in members if m.ended and m.ended.get("reason") != "done"]
        joined = [m for m in self.members.values() if not m.in_round and not m.gone]
        if bad and not (lost or joined) and self._following(bad, now):
            bad = []  # the others save at the same step by themselves, as the first did
        if (lost or bad or joined) and not self.stop_sent:
            if lost:
                self.why = f"node {lost[0].rank} was lost (its launcher ended or fell silent)"
            elif bad:
                first = bad[0].ended
                self.why = f"node {bad[0].rank}: {first.get('failure') or first.get('reason')}"
            else:  # an elastic job grows: every task saves at the same step (SIGTERM)
                size = len([m for m in members if not m.gone]) + len(joined)
                self.why = f"node {joined[0].rank} joined: the job grows to {size} nodes"
            self.say(f"Stopping every node: {self.why}.")
            self._broadcast("stop", round=self.round, why=self.why)
            self.stop_sent, self.stopped_at = True, now
        waiting = [m for m in members if not m.gone and m.ended is None]
        if (
            not self.stop_sent
            and self.scripts
            and all(
                self.members[r].ended and self.members[r].ended.get("reason") == "done"
                for r in self.scripts
            )
        ):  # only servers left running (a parameter-server job): they stop at the finish
            return self._finish("done", "every task that runs the script is done.")
        if waiting and not (self.stop_sent and now - self.stopped_at > self.grace + 60):
            return
        for member in waiting:  # did not report in time: taken as lost
            member.gone = True
            member.line.close()
        reasons = [m.ended.get("reason") for m in members if m.ended]
        if not lost and not waiting and reasons and all(r == "done" for r in reasons):
            return self._finish("done", "every node is done.")
        final = [m for m in members if m.ended and m.ended.get("reason") in FINAL]
        if final:
            ended = final[0].ended
            return self._finish(
                "failed",
                f"node {final[0].rank}: {ended.get('failure') or FINAL[ended['reason']]}; "
                "the job is not restarted.",
            )
        # an elastic job goes on without a lost node (or waits for it): not counted
        failed = (bool(lost or waiting) and not self.elastic) or any(
            r not in ("done", "preempted", "stopped") for r in reasons
        )
        if failed:
            if self.restarts >= self.max_restarts:
                return self._finish(
                    "failed",
                    f"{self.why}; after {self.restarts} restart"
                    f"{'' if self.restarts == 1 else 's'} (--max-restarts {self.max_restarts}) "
                    "the job ends.",
                )
            self.restarts += 1
            how = f"restart {self.restarts}/{self.max_restarts}"
        elif lost or waiting or joined:
            how = "the nodes changed, not counted against --max-restarts"
        else:
            self.preemptions += 1
            how = "after a preemption, not counted against --max-restarts"
        self.round += 1
        self.phase, self.deadline = "gathering", now + self.timeout
        for member in self.members.values():
            member.ready = member.ended = None
        why = self.why or "every task saved after a preemption"
        self.say(f"Restarting the job on every node ({how}): {why}.")
        self._broadcast("again", round=self.round, restarts=self.restarts, why=self.why)

    def _following(self, bad: List[_Member], now: float) -> bool:
        """Whether the nodes still get time to follow a preemption: when every node that
        ended did so preempted (its tasks saved and exited with 143), the others' tasks stop
        at the same step by themselves (tfdist.BackupAndRestore); a stop now would cut them
        short. They get `grace` seconds, as the tasks of a local job do."""
        if any(m.ended.get("reason") != "preempted" for m in bad):
            return False
        if self.preempted_at is None:
            self.preempted_at = now
        return now - self.preempted_at < self.grace

    def _finish(self, reason: str, message: str) -> None:
        self.phase, self.outcome = "finished", (reason, message)
        self._broadcast("finish", reason=reason, message=message)
        self.cond.notify_all()


def _spec(nodes: Tuple[int, int]) -> str:
    return str(nodes[0]) if nodes[0] == nodes[1] else f"{nodes[0]}:{nodes[1]}"


def _layout(readies: Dict[int, dict]) -> Tuple[dict, Dict[int, List[str]]]:
    """The cluster of the nodes' `ready` messages (by rank), in rank order, and each node's
    tasks.

    Each node's ports: its workers', then its ps'; node 0's first port is the chief's where the
    job has ps tasks.
    """
    cluster: Dict[str, List[str]] = {"chief": [], "worker": [], "ps": []}
    tasks: Dict[int, List[str]] = {}
    has_ps = any(r["ps"] for r in readies.values())
    first = min(readies)
    for rank, ready in readies.items():
        host, ports = ready["host"], list(ready["ports"])
        mine = []
        if rank == first and has_ps:
            cluster["chief"].append(f"{host}:{ports.pop(0)}")
            mine.append("chief:0")
        for kind, count in (("worker", ready["workers"]), ("ps", ready["ps"])):
            for _ in range(count):
                mine.append(f"{kind}:{len(cluster[kind])}")
                cluster[kind].append(f"{host}:{ports.pop(0)}")
        tasks[rank] = mine
    return {k: v for k, v in cluster.items() if v}, tasks


def _runs_script(names: List[str], cluster: dict) -> bool:
    """Whether one of these tasks runs the script: in a parameter-server job the chief (the
    workers and ps serve), else any worker or chief."""
    jobs = {name.partition(":")[0] for name in names}
    return "chief" in jobs or ("ps" not in cluster and "worker" in jobs)


class Client:
    """A node's connection to the rendezvous: see the module's docstring.

    `connect` retries until the rendezvous answers (at most `timeout` seconds); a reader
    thread then takes the server's messages: `wait` returns the next one of the ops asked for,
    `stop_reason` says whether the running attempt must stop (a `stop`, or the rendezvous
    lost).
    """

    def __init__(
        self,
        address: Tuple[str, int],
        *,
        token: str,
        rank: int,
        nodes: int,
        digest: str,
        version: str,
        timeout: float,
        source: Optional[str] = None,
        ps: int = 0,
    ):
        self.address, self.token, self.rank, self.nodes = address, token, rank, nodes
        self.ps = ps
        self.digest, self.version, self.timeout, self.source = digest, version, timeout, source
        self.line: Optional[_Line] = None
        self.messages: "queue.Queue[dict]" = queue.Queue()
        self.round = 0
        self.restarts = 0
        self.stop: Optional[str] = None
        self.lost = False

    @property
    def where(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def local_host(self) -> str:
        """This node's address as the rendezvous sees it (where the others reach it)."""
        return self.line.sock.getsockname()[0]

    def connect(self) -> "Client":
        deadline = time.monotonic() + self.timeout
        while True:
            answer, line = self._join(deadline)
            if answer.get("op") == "welcome":
                break
            line.close()
            why = answer.get("why", "the connection ended")
            if not answer.get("retry") or time.monotonic() >= deadline:
                raise RendezvousError(f"The rendezvous at {self.where} refused this node: {why}")
            time.sleep(1.0)
        self.line, self.round, self.restarts = line, answer["round"], answer["restarts"]
        self.lost, self.stop = False, None
        self.messages = queue.Queue()
        threading.Thread(target=self._read, args=(line,), daemon=True).start()
        threading.Thread(target=self._beat, args=(line,), daemon=True).start()
        return self

    def _join(self, deadline: float) -> Tuple[dict, _Line]:
        """Connects (retrying until `deadline`), proves the token; the server's answer."""
        last = "no answer"
        while True:
            try:
                sock = socket.create_connection(
                    self.address,
                    timeout=min(5.0, max(0.1, deadline - time.monotonic())),
                    source_address=(self.source, 0) if self.source else None,
                )
                line = _Line(sock)
                challenge = line.recv(JOIN_TIMEOUT)
                if challenge and challenge.get("op") == "challenge":
                    break
                line.close()
                last = "it answered, but not as a tfdist rendezvous"
            except OSError as err:  # refused, unreachable, or timed out (socket.timeout)
                last = getattr(err, "strerror", None) or str(err) or type(err).__name__
            if time.monotonic() >= deadline:
                raise RendezvousError(
                    f"No rendezvous answered at {self.where} within {self.timeout:g} s "
                    f"({last}). HINT: start node 0 (--node-rank 0) with the same --rendezvous; "
                    "check that this host reaches that address and port (a firewall?); "
                    "--rendezvous-timeout waits longer."
                )
            time.sleep(1.0)
        nonce = secrets.token_hex(16)
        line.send(
            "join",
            rank=self.rank,
            nodes=self.nodes,
            ps=self.ps,
            proof=_proof(self.token, challenge["nonce"]),
            nonce=nonce,
            digest=self.digest,
            version=self.version,
            restarts=self.restarts,
            lost=self.lost,
        )
        try:
            answer = line.recv(JOIN_TIMEOUT)
        except socket.timeout:
            answer = None
        answer = answer or {"op": "refused", "why": "the connection ended", "retry": True}
        if answer.get("op") == "welcome":  # the rendezvous proves the token too
            expected = _proof(self.token, "rendezvous:" + nonce).encode()
            if not hmac.compare_digest(str(answer.get("proof", "")).encode(), expected):
                line.close()
                raise RendezvousError(
                    f"The rendezvous at {self.where} does not hold the job's token: it is "
                    "not this job's. HINT: check --rendezvous and the token on every node."
                )
        return answer, line

    def _read(self, line: _Line) -> None:
        while True:
            try:
                message = line.recv(PEER_TIMEOUT)
            except socket.timeout:
                message = None
            if message is None:
                if line is self.line and not line.closed:
                    self.lost = True
                    self.stop = self.stop or f"the rendezvous at {self.where} is gone"
                    self.messages.put({"op": "lost"})
                line.close()
                return
            if line is not self.line:  # an old connection's last words
                return
            op = message.get("op")
            if op == "beat":
                continue
            if op == "stop" and message.get("round") == self.round:
                self.stop = self.stop or message.get("why", "stopped by the rendezvous")
            if op == "again":
                self.round, self.restarts = message["round"], message["restarts"]
            if op == "finish":  # a node that only serves stops here
                self.stop = self.stop or f"the job ended {message.get('reason')}"
            self.messages.put(message)

    def _beat(self, line: _Line) -> None:
        while not line.closed and line.send("beat"):
            time.sleep(BEAT)

    def send(self, op: str, **fields) -> None:
        if self.line is not None:
            self.line.send(op, **fields)

    def ready(self, host: str, ports: List[int], workers: int, ps: int) -> None:
        self.stop = None
        self.send("ready", round=self.round, host=host, ports=ports, workers=workers, ps=ps)

    def wait(self, ops: Tuple[str, ...], timeout: Optional[float] = None) -> dict:
        """The next message of one of `ops` (or "lost": the connection ended or fell silent
        for PEER_TIMEOUT seconds, or `timeout` passed): stop messages of a past round and
        others are skipped."""
        deadline = time.monotonic() + (math.inf if timeout is None else timeout)
        while True:
            left = min(deadline - time.monotonic(), 3600.0)
            if left <= 0:
                return {"op": "lost", "why": f"no word from the rendezvous in {timeout:g} s"}
            try:
                message = self.messages.get(timeout=left)
            except queue.Empty:
                continue
            if message["op"] in ops or message["op"] == "lost":
                return message

    def stop_reason(self) -> Optional[str]:
        """`run_job`'s `stop_when`: why the running attempt must stop, or None."""
        return self.stop

    def close(self) -> None:
        if self.line is not None:
            self.line.close()
