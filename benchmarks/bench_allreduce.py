"""The all-reduce alone: algorithm bandwidth of one float32 tensor summed over 2 processes.

Several all-reduces on loopback, 2 processes, at 1, 16 and 128 MiB of float32:

- TensorFlow's default: `tf.distribute.MultiWorkerMirroredStrategy()` built as a user would,
  `ReplicaContext.all_reduce("SUM", x)` inside `strategy.run` in a `tf.function`;
- tfdist's default: the same call on `tfdist.make_strategy("multi_worker_mirrored")`;
- tfdist with `gradient_compression="bf16"` and `"fp16"` (the same job as tfdist's default:
  the compression of its strategy is switched between measurements);
- tfdist with `communication="gloo"` (torch.distributed's Gloo, the extra tfdist[gloo]), without
  and with bf16 compression (one job, switched the same way);
- a plain numpy ring all-reduce over TCP sockets (reduce-scatter then all-gather, the send of
  each step in a thread while the receive lands in place), the bandwidth the loopback carries
  for this job.

Every TensorFlow variant writes its float32 result into a variable (the cast back included).
Metric: algorithm bandwidth = float32 payload bytes / seconds per all-reduce (GB/s, 1e9), the
median of `reps` calls after a warm-up; each job runs once per round, the job order rotating
every round; rows are medians over rounds. The chart (PNG, matplotlib) is written beside the
results JSON (`benchmarks/results/allreduce-<timestamp>.png`).

`python benchmarks/bench_allreduce.py --knobs` measures TensorFlow's own knobs instead (see
benchmarks/README.md): RING vs AUTO, packs (the payload as several tensors with
`bytes_per_pack`), inter/intra-op threads, `ConfigProto.experimental.recv_buf_max_chunk` and
`rpc_options.num_channels_per_target`.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SIZES_MIB = (1, 16, 128)
DEFAULT = {"rounds": 5, "reps": 5, "timeout": 900}
QUICK = {"rounds": 2, "reps": 3, "timeout": 400}
MODE_NAMES = ("None", "bf16", "fp16")  # tfdist's gradient_compression, as strings
GLOO_NAMES = ("gloo", "gloo bf16")  # communication="gloo", without and with bf16
VARIANTS = ("tf", *MODE_NAMES, *GLOO_NAMES, "ring")
JOBS = {"tf": ("tf",), "tfdist": MODE_NAMES, "gloo": GLOO_NAMES, "ring": ("ring",)}


def _gbps(count: int, seconds: float) -> float:
    return count * 4 / seconds / 1e9


def _tf_step(strategy, count: int):
    """A tf.function: one all-reduce of `count` float32 through `strategy`, result stored."""
    import tensorflow as tf

    device = strategy.extended.worker_devices[0]
    with tf.device(device):
        x = tf.Variable(tf.ones([count]), trainable=False)
        out = tf.Variable(tf.zeros([count]), trainable=False)

    @tf.function
    def step():
        def replica():
            total = tf.distribute.get_replica_context().all_reduce("SUM", tf.identity(x))
            out.assign(total)
            return out[0] + out[-1]

        return strategy.run(replica)

    return step


def _seconds(call, reps: int) -> float:
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def schedule(cfg: dict) -> list:
    """The turns of one run: (round, size MiB, variant), the variant order rotating."""
    turns = []
    for r in range(cfg["rounds"]):
        for mib in SIZES_MIB:
            k = (r + SIZES_MIB.index(mib)) % len(VARIANTS)
            turns += [(r, mib, v) for v in VARIANTS[k:] + VARIANTS[:k]]
    return turns


def variant_job(job: str, directory: str, cfg: dict) -> dict:
    """In each process of one job (`JOBS`): {variant: {size: [GB/s per turn]}}.

    The jobs run at once and take turns (`schedule`): one all-reduces at a time.
    """
    mine = JOBS[job]
    me = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    if job == "ring":
        import numpy as np

        rank, n, send, recv = _ring_sockets()
    elif job == "tf":
        import tensorflow as tf

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        import tfdist
        from tfdist.strategy.compression import compress_multi_worker

        communication = "gloo" if job == "gloo" else "auto"
        strategy = tfdist.make_strategy("multi_worker_mirrored", communication=communication)
    steps, out = {}, {v: {} for v in mine}
    for index, (_, mib, variant) in enumerate(schedule(cfg)):
        if variant not in mine:
            continue
        common.wait_for_scheduled_turn(directory, index)
        count = mib << 18
        if job == "ring":
            data = np.ones(count, np.float32)
            scratch = np.empty(count // n + n, np.float32)
            ring_allreduce(data, rank, n, send, recv, scratch)  # warm-up, and the sum
            assert data[0] == n and data[-1] == n
            args = (data, rank, n, send, recv, scratch)
            seconds = _seconds(lambda args=args: ring_allreduce(*args), cfg["reps"])
        else:
            if (mib, variant) not in steps:
                if job != "tf":  # read when the step is traced
                    mode = variant.split()[-1]
                    compress_multi_worker(strategy, mode if mode in ("bf16", "fp16") else None)
                steps[(mib, variant)] = _tf_step(strategy, count)
            step = steps[(mib, variant)]
            assert float(step()) == 2 * strategy.num_replicas_in_sync  # warm-up, and the sum
            seconds = _seconds(lambda step=step: step().numpy(), cfg["reps"])
        out[variant].setdefault(mib, []).append(_gbps(count, seconds))
        common.end_scheduled_turn(directory, index, me)
    if job == "ring":
        send.close()
        recv.close()
    return out


def _ring_sockets():
    import socket

    cfg = json.loads(os.environ["TF_CONFIG"])
    addresses = cfg["cluster"]["worker"]
    rank, n = cfg["task"]["index"], len(addresses)
    host, port = addresses[rank].rsplit(":", 1)
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, int(port)))
    server.listen(1)
    next_host, next_port = addresses[(rank + 1) % n].rsplit(":", 1)
    deadline = time.monotonic() + 60
    while True:
        try:
            send = socket.create_connection((next_host, int(next_port)))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    recv, _ = server.accept()
    server.close()
    for s in (send, recv):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return rank, n, send, recv


def ring_allreduce(a, rank: int, n: int, send, recv, scratch) -> None:
    """Sums the float32 array `a` in place over the `n` ring processes (numpy, TCP)."""
    import numpy as np

    bounds = np.linspace(0, a.size, n + 1).astype(int)

    def segment(i):
        return a[bounds[i] : bounds[i + 1]]

    def exchange(out, into):
        sender = threading.Thread(target=send.sendall, args=(memoryview(out).cast("B"),))
        sender.start()
        view, got = memoryview(into).cast("B"), 0
        while got < len(view):
            got += recv.recv_into(view[got:])
        sender.join()

    for step in range(n - 1):  # reduce-scatter
        incoming = segment((rank - step - 1) % n)
        buffer = scratch[: incoming.size]
        exchange(segment((rank - step) % n), buffer)
        np.add(incoming, buffer, out=incoming)
    for step in range(n - 1):  # all-gather
        exchange(segment((rank + 1 - step) % n), segment((rank - step) % n))


def measure(cfg: dict) -> dict:
    """{variant: {size: [GB/s per round]}}: the jobs at once, taking turns."""
    import concurrent.futures
    import tempfile

    env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
    samples = {v: {mib: [] for mib in SIZES_MIB} for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="tfdist-allreduce-") as directory:
        with concurrent.futures.ThreadPoolExecutor(len(JOBS)) as pool:
            futures = [
                pool.submit(
                    common.run_fresh,
                    variant_job,
                    workers=2,
                    args=(job, directory, cfg),
                    env=env,
                    timeout=cfg["timeout"],
                )
                for job in JOBS
            ]
            for future in futures:
                runs = future.result()
                for variant in runs[0]:
                    for mib in SIZES_MIB:
                        # an all-reduce ends for both processes: the slower one counts
                        pair = zip(runs[0][variant][mib], runs[1][variant][mib])
                        samples[variant][mib] = [min(a, b) for a, b in pair]
    return samples


def chart(samples: dict, path: str) -> str:
    """A grouped bar chart (GB/s per size and variant) written to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [("tf", "TensorFlow default"), ("None", "tfdist default"), ("bf16", "tfdist bf16"),
             ("fp16", "tfdist fp16"), ("gloo", "tfdist gloo"), ("gloo bf16", "tfdist gloo bf16"),
             ("ring", "numpy TCP ring")]  # fmt: skip
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.12
    for i, (key, label) in enumerate(names):
        values = [statistics.median(samples[key][mib]) for mib in SIZES_MIB]
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(SIZES_MIB))]
        bars = ax.bar(xs, values, width, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(len(SIZES_MIB)), [f"{m} MiB" for m in SIZES_MIB])
    ax.set_ylabel("algorithm bandwidth (GB/s, float32 payload)")
    ax.set_title("All-reduce, 2 processes on loopback (medians over rounds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(quick: bool) -> list:
    cfg = QUICK if quick else DEFAULT
    samples = measure(cfg)
    rows = []
    for mib in SIZES_MIB:
        tf_, none, bf16, fp16, gloo, gloo_bf16, ring = (
            samples[k][mib] for k in ("tf", "None", "bf16", "fp16", "gloo", "gloo bf16", "ring")
        )
        size = f"all-reduce {mib} MiB"
        rows += [
            common.row(f"{size}, tfdist default", none, tf_, "TF default", "GB/s", target=1.0),
            common.row(f"{size}, tfdist default", none, ring, "numpy ring", "GB/s",
                       target=0.5 if mib >= 16 else None),
            common.row(f"{size}, tfdist bf16", bf16, tf_, "TF default", "GB/s", target=2.0),
            common.row(f"{size}, tfdist fp16", fp16, tf_, "TF default", "GB/s"),
            common.row(f"{size}, tfdist bf16", bf16, ring, "numpy ring", "GB/s"),
            common.row(f"{size}, tfdist gloo", gloo, ring, "numpy ring", "GB/s",
                       target=0.5 if mib >= 16 else None),
            common.row(f"{size}, tfdist gloo", gloo, none, "tfdist default", "GB/s"),
            common.row(f"{size}, tfdist gloo bf16", gloo_bf16, gloo, "tfdist gloo", "GB/s"),
        ]  # fmt: skip
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    os.makedirs(common.RESULTS_DIR, exist_ok=True)
    png = os.path.join(common.RESULTS_DIR, f"allreduce-{stamp}.png")
    try:
        chart(samples, png)
    except ImportError as err:  # matplotlib is in the "bench" extra
        png = f"no chart: {err}"
    for r in rows:
        r["chart"] = png
        r["settings"] = cfg
        r["cpu_model"] = common.cpu_model()
    return rows


# ------------------------------------------------------------------ TensorFlow's knobs

# Process-level settings (one 2-process job each) and, in the first job, per-call variants.
KNOB_JOBS = {
    "default": {},
    "threads 1/1": {"threads": (1, 1)},
    "threads 4/2": {"threads": (4, 2)},
    "recv_buf_max_chunk -1": {"chunk": -1},
    "recv_buf_max_chunk 64 KiB": {"chunk": 64},
    "num_channels_per_target 4": {"channels": 4},
}
KNOB_CALLS = ("AUTO", "RING", "packs 4", "packs 32")  # in the "default" job
KNOB_SIZES = (16, 128)


def knob_turns(rounds: int, group: tuple) -> list:
    """(round, size, job, call) turns of one group of jobs, the order rotating every round."""
    variants = []
    for job in group:
        calls = KNOB_CALLS if job == "default" and len(group) == 1 else ("AUTO",)
        variants += [(job, call) for call in calls]
    turns = []
    for r in range(rounds):
        for mib in KNOB_SIZES:
            k = r % len(variants)
            turns += [(r, mib, j, c) for j, c in variants[k:] + variants[:k]]
    return turns


def knob_job(name: str, group: tuple, directory: str, rounds: int, reps: int) -> dict:
    """In each process of one knob job: {call: {size: [GB/s per turn]}}."""
    import tensorflow as tf

    spec = KNOB_JOBS[name]
    if "threads" in spec:
        tf.config.threading.set_inter_op_parallelism_threads(spec["threads"][0])
        tf.config.threading.set_intra_op_parallelism_threads(spec["threads"][1])
    if "chunk" in spec or "channels" in spec:
        # neither has a public setter in TF 2: the eager context's ConfigProto (diagnosis only)
        from tensorflow.core.protobuf import config_pb2
        from tensorflow.python.eager import context

        config = config_pb2.ConfigProto()
        if "chunk" in spec:
            config.experimental.recv_buf_max_chunk = spec["chunk"]
        if "channels" in spec:
            config.rpc_options.num_channels_per_target = spec["channels"]
        context.context()._config = config
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    implementation = tf.distribute.experimental.CommunicationImplementation
    me = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    out, steps = {}, {}
    for index, (_, mib, job, call) in enumerate(knob_turns(rounds, group)):
        if job != name:
            continue
        common.wait_for_scheduled_turn(directory, index)
        count = mib << 18
        if (mib, call) not in steps:
            parts = int(call.split()[1]) if call.startswith("packs") else 1
            options = tf.distribute.experimental.CommunicationOptions(
                bytes_per_pack=count * 4 // parts if parts > 1 else 0,
                implementation=implementation.RING if call == "RING" else implementation.AUTO,
            )
            with tf.device(strategy.extended.worker_devices[0]):
                xs = [tf.Variable(tf.ones([count // parts]), trainable=False) for _ in range(parts)]

            @tf.function
            def step(xs=xs, options=options):
                def replica():
                    totals = tf.distribute.get_replica_context().all_reduce(
                        "SUM", [tf.identity(x) for x in xs], options=options
                    )
                    for x, total in zip(xs, totals):
                        x.assign(total / 2.0)
                    return xs[0][0]

                return strategy.run(replica)

            steps[(mib, call)] = step
        step = steps[(mib, call)]
        step()
        seconds = _seconds(lambda step=step: step().numpy(), reps)
        out.setdefault(call, {}).setdefault(mib, []).append(_gbps(count, seconds))
        common.end_scheduled_turn(directory, index, me)
    return out


def knobs(rounds: int = 3, reps: int = 5) -> dict:
    """{"job / call": {size: median GB/s}, "job / call / vs default": {size: ratio}}.

    First TensorFlow's per-call options in one job (TensorFlow's default, RING, packs), then
    each process-level knob as a job running beside a default job, the two taking turns: at
    most 4 processes at once, and each knob compared with a default measured beside it.
    """
    import concurrent.futures
    import tempfile

    env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
    results = {}
    groups = [("default",)] + [("default", name) for name in KNOB_JOBS if name != "default"]
    for group in groups:
        with tempfile.TemporaryDirectory(prefix="tfdist-knobs-") as directory:
            with concurrent.futures.ThreadPoolExecutor(len(group)) as pool:
                futures = {
                    name: pool.submit(
                        common.run_fresh,
                        knob_job,
                        workers=2,
                        args=(name, group, directory, rounds, reps),
                        env=env,
                        timeout=900,
                    )
                    for name in group
                }
                found = {}
                for name, future in futures.items():
                    runs = future.result()
                    for call, by_size in runs[0].items():
                        found[(name, call)] = {
                            mib: [min(a, b) for a, b in zip(by_size[mib], runs[1][call][mib])]
                            for mib in KNOB_SIZES
                        }
        for (name, call), by_size in found.items():
            if len(group) > 1 and name == "default":
                continue
            results[f"{name} / {call}"] = {m: statistics.median(v) for m, v in by_size.items()}
            base = found[("default", "AUTO")]
            if (name, call) != ("default", "AUTO"):
                results[f"{name} / {call} / vs default beside it"] = {
                    m: statistics.median([x / y for x, y in zip(v, base[m])])
                    for m, v in by_size.items()
                }
        print(json.dumps({k: v for k, v in results.items()}), flush=True)
    return results


if __name__ == "__main__":
    if "--knobs" in sys.argv:
        found = knobs()
        for key, by_size in found.items():
            unit = "x" if key.endswith("beside it") else " GB/s"
            print(f"{key:52} " + "  ".join(f"{m} MiB {v:.3f}{unit}" for m, v in by_size.items()))
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = os.path.join(common.RESULTS_DIR, f"allreduce-knobs-{stamp}.json")
        os.makedirs(common.RESULTS_DIR, exist_ok=True)
        with open(path, "w") as f:
            json.dump({"cpu_model": common.cpu_model(), "knobs": found}, f, indent=2)
        print(f"results: {path}")
        sys.exit(0)
    rows = run("--quick" in sys.argv)
    common.print_table(rows)
    stamp = os.path.basename(rows[0]["chart"]).replace("allreduce-", "").replace(".png", "")
    path = os.path.join(common.RESULTS_DIR, f"allreduce-{stamp}.json")
    common.write_json(rows, {"benchmark": "allreduce", "cpu_model": common.cpu_model()}, path)
    print(f"results: {path}\nchart: {rows[0]['chart']}")
