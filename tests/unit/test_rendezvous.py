"""The rendezvous of a multi-node job (tfdist.launcher.rendezvous), its server and clients on
loopback, without TensorFlow: who is let in, the cluster it lays out, and how a lost or failed
node stops and restarts every node. The jobs themselves: tests/cluster/test_multi_node.py."""

import socket
import time

import pytest

from tfdist.cluster.spec import free_ports
from tfdist.launcher.nodes import launch_nodes
from tfdist.launcher.rendezvous import Client, RendezvousError, Server, parse_address

TOKEN = "the-job-token"


@pytest.fixture
def server():
    """A 2-node rendezvous on loopback, and the lines it said."""
    said = []
    made = []

    def make(nodes=2, max_restarts=1, timeout=30.0):
        made.append(
            Server(
                ("127.0.0.1", 0),
                token=TOKEN,
                nodes=nodes,
                max_restarts=max_restarts,
                digest="script-1",
                version="1.0",
                timeout=timeout,
                grace=1.0,
                say=said.append,
            ).start()
        )
        made[-1].said = said
        return made[-1]

    yield make
    for s in made:
        s.close()


def _client(server, rank, token=TOKEN, nodes=2, digest="script-1", version="1.0", timeout=10):
    return Client(
        ("127.0.0.1", server.port),
        token=token,
        rank=rank,
        nodes=nodes,
        digest=digest,
        version=version,
        timeout=timeout,
    )


def _ready(client, workers=1, ps=0):
    client.ready(
        "127.0.0.1", free_ports(workers + ps + (1 if client.rank == 0 and ps else 0)), workers, ps
    )


def test_only_nodes_with_the_token_the_script_and_the_version_get_in(server):
    rendezvous = server()
    first = _client(rendezvous, 0).connect()
    refusals = {
        "a wrong token": dict(token="guess"),
        "another script or other arguments": dict(digest="script-2"),
        "tfdist 0.9; the job runs tfdist 1.0": dict(version="0.9"),
        "--nodes 3; the job has 2": dict(nodes=3),
        "rank 5 is not one of 0..1": dict(rank=5),
    }
    for why, kwargs in refusals.items():
        rank = kwargs.pop("rank", 1)
        with pytest.raises(RendezvousError, match="refused this node: .*" + why.split(";")[0]):
            _client(rendezvous, rank, **kwargs).connect()
        assert any(why.split(";")[0] in line for line in rendezvous.said), rendezvous.said
    # a connection that speaks no tfdist is refused too, and the job is not disturbed
    with socket.create_connection(("127.0.0.1", rendezvous.port)) as raw:
        raw.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert b"refused" in raw.recv(4096) + raw.recv(4096)
    second = _client(rendezvous, 1).connect()
    for client in (first, second):
        _ready(client)
    starts = [c.wait(("start",), 10) for c in (first, second)]
    assert [s["op"] for s in starts] == ["start", "start"]
    assert starts[0]["cluster"] == starts[1]["cluster"]
    assert len(starts[0]["cluster"]["worker"]) == 2
    assert (starts[0]["tasks"], starts[1]["tasks"]) == (["worker:0"], ["worker:1"])


def test_the_cluster_is_laid_out_in_rank_order_with_the_chief_on_node_0(server):
    rendezvous = server(nodes=3)
    clients = [_client(rendezvous, rank, nodes=3).connect() for rank in (2, 0, 1)]
    for client in clients:
        client.ready(
            f"127.0.0.{client.rank + 1}", [10 + client.rank * 10 + i for i in range(3)], 1, 1
        )
    starts = {c.rank: c.wait(("start",), 10) for c in clients}
    assert starts[0]["cluster"] == {
        "chief": ["127.0.0.1:10"],
        "worker": ["127.0.0.1:11", "127.0.0.2:20", "127.0.0.3:30"],
        "ps": ["127.0.0.1:12", "127.0.0.2:21", "127.0.0.3:31"],
    }
    assert starts[0]["tasks"] == ["chief:0", "worker:0", "ps:0"]
    assert starts[2]["tasks"] == ["worker:2", "ps:2"]


def test_a_lost_node_stops_every_node_and_the_job_restarts_when_it_is_back(server):
    rendezvous = server(max_restarts=1)
    first, second = _client(rendezvous, 0).connect(), _client(rendezvous, 1).connect()
    for client in (first, second):
        _ready(client)
    assert [c.wait(("start",), 10).get("round") for c in (first, second)] == [0, 0]
    second.line.close()  # as a launcher killed with SIGKILL: its connection ends
    deadline = time.monotonic() + 10
    while first.stop_reason() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "node 1 was lost" in (first.stop_reason() or "")
    first.send("ended", round=0, reason="stopped", failure="")
    again = first.wait(("again", "finish"), 10)
    assert (again["op"], again["round"], again["restarts"]) == ("again", 1, 1)

    # node 1 comes back: a new launcher, a new connection; both start round 1 together
    back = _client(rendezvous, 1).connect()
    for client in (first, back):
        _ready(client)
    assert [c.wait(("start",), 10)["round"] for c in (first, back)] == [1, 1]

    # a task of node 0 fails: node 1 is stopped; the restarts are used up, so the job ends
    first.send("ended", round=1, reason="failed", failure="worker:0 exited with code 1")
    deadline = time.monotonic() + 10
    while back.stop_reason() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert back.stop_reason() == "node 0: worker:0 exited with code 1"
    back.send("ended", round=1, reason="stopped", failure="")
    for client in (first, back):
        finish = client.wait(("finish",), 10)
        assert finish["reason"] == "failed"
        assert "after 1 restart (--max-restarts 1) the job ends" in finish["message"]


def test_a_preemption_restarts_without_counting_and_done_everywhere_ends_the_job(server):
    rendezvous = server(max_restarts=0)
    clients = [_client(rendezvous, rank).connect() for rank in (0, 1)]
    for client in clients:
        _ready(client)
    assert [c.wait(("start",), 10)["op"] for c in clients] == ["start", "start"]
    for client in clients:
        client.send("ended", round=0, reason="preempted", failure="")
    for client in clients:
        again = client.wait(("again",), 10)
        assert (again.get("round"), again.get("restarts")) == (1, 0)
        _ready(client)
    for client in clients:
        assert client.wait(("start",), 10)["op"] == "start"
    for client in clients:
        client.send("ended", round=1, reason="done", failure="")
    assert [c.wait(("finish",), 10)["reason"] for c in clients] == ["done", "done"]


def test_nodes_that_never_all_join_end_the_job_within_the_bound(server):
    rendezvous = server(timeout=1.5)
    client = _client(rendezvous, 0).connect()
    _ready(client)
    finish = client.wait(("finish",), 10)
    assert finish["reason"] == "failed"
    assert "node 1 did not join the rendezvous within 1.5 s" in finish["message"]


def test_a_rendezvous_that_never_starts_is_given_up_with_its_address():
    (port,) = free_ports(1)
    started = time.monotonic()
    client = Client(
        ("127.0.0.1", port), token=TOKEN, rank=1, nodes=2, digest="d", version="v", timeout=2
    )
    with pytest.raises(RendezvousError, match=rf"No rendezvous answered at 127\.0\.0\.1:{port} "):
        client.connect()
    assert time.monotonic() - started < 8


def test_bad_arguments_are_refused_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.delenv("TFDIST_RENDEZVOUS_TOKEN", raising=False)
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    cases = {
        "--rendezvous must be HOST:PORT": dict(rendezvous="node0"),
        "--node-rank must be one of 0..1": dict(node_rank=2),
        "--nodes must be a whole number >= 1": dict(nodes=0),
        "--workers-per-node must be": dict(workers_per_node=0),
        "Node 1 has no token": dict(token=None),
    }
    for message, change in cases.items():
        kwargs = dict(nodes=2, node_rank=1, rendezvous="127.0.0.1:1", token=None)
        kwargs.update(change)
        with pytest.raises(ValueError, match=message):
            launch_nodes(str(script), **kwargs)
    assert parse_address("[::1]:29400") == ("::1", 29400)


def test_an_elastic_job_starts_on_min_grows_when_a_node_joins_and_goes_on_without_a_lost_one(
    server, monkeypatch
):
    from tfdist.launcher import rendezvous as rendezvous_module

    monkeypatch.setattr(rendezvous_module, "ELASTIC_WINDOW", 0.5)
    rendezvous = server(nodes=(2, 3), max_restarts=0)
    first, second = (_client(rendezvous, r, nodes=[2, 3]).connect() for r in (0, 1))
    for client in (first, second):
        _ready(client)
    starts = [c.wait(("start",), 10) for c in (first, second)]
    assert [len(s.get("cluster", {}).get("worker", [])) for s in starts] == [2, 2]

    third = _client(rendezvous, 2, nodes=[2, 3]).connect()  # joins the running job
    _ready(third)
    deadline = time.monotonic() + 10
    while None in (first.stop_reason(), second.stop_reason()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.stop_reason() == "node 2 joined: the job grows to 3 nodes"
    for client in (first, second):
        client.send("ended", round=0, reason="preempted", failure="")  # saved at one step
    for client in (first, second, third):
        again = client.wait(("again",), 10)
        assert (again.get("round"), again.get("restarts")) == (1, 0)
        _ready(client)
    starts = [c.wait(("start",), 10) for c in (first, second, third)]
    assert [s.get("tasks") for s in starts] == [["worker:0"], ["worker:1"], ["worker:2"]]

    third.line.close()  # lost, and not back: the others go on without it, not counted
    deadline = time.monotonic() + 10
    while first.stop_reason() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    for client in (first, second):
        client.send("ended", round=1, reason="stopped", failure="")
    for client in (first, second):
        assert client.wait(("again",), 10).get("restarts") == 0
        _ready(client)
    starts = [c.wait(("start",), 10) for c in (first, second)]
    assert [len(s.get("cluster", {}).get("worker", [])) for s in starts] == [2, 2]
    assert "Starting on 2 nodes (2:3)." in rendezvous.said


def test_a_node_that_falls_silent_is_taken_as_lost(server, monkeypatch):
    """A launcher that stops answering (SIGSTOP, a machine gone without closing its
    connections) is lost after PEER_TIMEOUT seconds without a beat (shortened here)."""
    from tfdist.launcher import rendezvous as rendezvous_module

    monkeypatch.setattr(rendezvous_module, "PEER_TIMEOUT", 1.5)
    monkeypatch.setattr(rendezvous_module, "BEAT", 0.2)
    rendezvous = server()
    first, second = _client(rendezvous, 0).connect(), _client(rendezvous, 1).connect()
    for client in (first, second):
        _ready(client)
    assert [c.wait(("start",), 10)["op"] for c in (first, second)] == ["start", "start"]
    second.line.send = lambda *args, **kwargs: True  # its beats stop; the connection stays
    deadline = time.monotonic() + 10
    while first.stop_reason() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "node 1 was lost" in (first.stop_reason() or "")
    assert "node 1 fell silent for 1.5 s." in rendezvous.said


def test_when_node_0_comes_back_the_nodes_join_its_new_rendezvous_with_their_restarts(server):
    """Node 0 hosts the rendezvous: when its launcher dies, the others' attempts stop (the
    rendezvous is gone) and they join the new one at the same address, counting the loss."""
    rendezvous = server(max_restarts=2)
    port = rendezvous.port
    node1 = _client(rendezvous, 1).connect()
    rendezvous.close()  # node 0's launcher is gone, and its rendezvous with it
    deadline = time.monotonic() + 10
    while node1.stop_reason() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert node1.stop_reason() == f"the rendezvous at 127.0.0.1:{port} is gone"
    assert node1.wait(("again", "finish"), 5)["op"] == "lost"

    said = []
    again = Server(
        ("127.0.0.1", port), token=TOKEN, nodes=2, max_restarts=2, digest="script-1",
        version="1.0", timeout=30, grace=1.0, say=said.append,
    ).start()  # fmt: skip
    try:
        node1.close()
        node1.connect()  # as the node's launcher does, within its rendezvous timeout
        node0 = _client(again, 0).connect()
        assert (node1.restarts, again.restarts) == (1, 1)
        for client in (node0, node1):
            _ready(client)
        assert [c.wait(("start",), 10)["op"] for c in (node0, node1)] == ["start", "start"]
    finally:
        again.close()


def test_nodes_must_agree_on_their_ps_tasks_and_odd_proofs_are_refused_and_logged(server):
    rendezvous = server()
    _client(rendezvous, 0).connect()
    other = _client(rendezvous, 1)
    other.ps = 1
    with pytest.raises(RendezvousError, match="--ps-per-node 1; the nodes that joined before"):
        other.connect()
    with socket.create_connection(("127.0.0.1", rendezvous.port)) as raw:
        raw.recv(4096)  # the challenge
        raw.sendall('{"op": "join", "rank": 1, "proof": "\\u00e9t\\u00e9"}\n'.encode())
        assert b"a wrong token" in raw.recv(4096)
    assert any("a wrong token" in line for line in rendezvous.said)


def test_a_rendezvous_without_the_token_is_not_trusted():
    """A listener at the rendezvous's address that welcomes anyone (not the job's) cannot hand
    the node a cluster: the rendezvous must prove the token too."""
    import threading

    listener = socket.create_server(("127.0.0.1", 0))

    def impostor():
        conn, _ = listener.accept()
        conn.sendall(b'{"op": "challenge", "nonce": "n"}\n')
        conn.recv(4096)
        conn.sendall(b'{"op": "welcome", "round": 0, "restarts": 0, "proof": "x"}\n')
        time.sleep(1)
        conn.close()

    threading.Thread(target=impostor, daemon=True).start()
    client = Client(
        ("127.0.0.1", listener.getsockname()[1]), token=TOKEN, rank=1, nodes=2, digest="d",
        version="v", timeout=5,
    )  # fmt: skip
    with pytest.raises(RendezvousError, match="does not hold the job's token"):
        client.connect()
    listener.close()


def test_a_timeout_ends_the_job_and_so_do_restarts_past_the_limit(server):
    rendezvous = server(max_restarts=3)
    clients = [_client(rendezvous, rank).connect() for rank in (0, 1)]
    for client in clients:
        _ready(client)
    assert [c.wait(("start",), 10)["op"] for c in clients] == ["start", "start"]
    clients[0].send("ended", round=0, reason="timeout", failure="")
    deadline = time.monotonic() + 10
    while clients[1].stop_reason() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    clients[1].send("ended", round=0, reason="stopped", failure="")
    finish = clients[1].wait(("finish",), 10)
    assert finish.get("reason") == "failed"
    assert "node 0: the job's --timeout passed; the job is not restarted" in finish["message"]

    # a new rendezvous (node 0's launcher died and came back) that the nodes bring 0 restarts
    # and the loss: with --max-restarts 0 the job ends instead of starting again
    again = server(max_restarts=0)
    back = [_client(again, rank) for rank in (0, 1)]
    back[1].lost = True
    for client in back:
        client.connect()
        _ready(client)
    finish = back[0].wait(("finish",), 10)
    assert finish.get("reason") == "failed"
    assert "restarted 1 times (--max-restarts 0)" in finish["message"]
