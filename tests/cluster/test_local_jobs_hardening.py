"""Local jobs: not reachable from other hosts, `--timeout` checked, TensorFlow's noise hidden.

Row 1: TensorFlow's gRPC servers listen on every interface ("0.0.0.0:PORT" in
grpc_server_lib.cc, every release). The launcher starts a job's tasks in a private network
namespace: the tests read each task's listening sockets from /proc/PID/net/tcp{,6} (the task's
own namespace) and the host's from /proc/self/net/tcp{,6}.
Row 7: `--timeout` / `timeout=` that is not a positive number of seconds is refused.
Row 9: the launcher forwards the user's output and its summary, not TensorFlow's start-up noise
(unless --verbose / TFDIST_VERBOSE=1), and never an error.
"""

import io
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from tfdist import netns
from tfdist.cli import main
from tfdist.launcher import job as job_module
from tfdist.launcher import launch, plan_job, run_job
from tfdist.launcher.noise import NoiseFilter
from tfdist.testing import run_cluster


def _script(tmp_path, body, name="job.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TFDIST_", "SLURM_"))}
    env.pop("TF_CONFIG", None)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the launcher must hide the noise by itself
    env.update(extra)
    return env


# ----------------------------------------------------------------- sockets, from /proc


def listeners(net_dir):
    """[(address, port)] of the TCP sockets listening in the namespace of `net_dir`
    (/proc/PID/net or /proc/self/net); address "0.0.0.0" / "::" is every interface."""
    found = []
    for name, width in (("tcp", 8), ("tcp6", 32)):
        try:
            with open(os.path.join(net_dir, name)) as f:
                rows = f.read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            fields = row.split()
            local, state = fields[1], fields[3]
            if state != "0A":  # LISTEN
                continue
            hex_address, hex_port = local.split(":")
            raw = bytes.fromhex(hex_address)
            if width == 8:
                address = socket.inet_ntop(socket.AF_INET, raw[::-1])
            else:  # four little-endian 32-bit words
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                address = socket.inet_ntop(socket.AF_INET6, words)
            found.append((address, int(hex_port, 16)))
    return found


def interfaces(net_dir):
    with open(os.path.join(net_dir, "dev")) as f:
        return [line.split(":")[0].strip() for line in f.read().splitlines()[2:]]


def _loopback(address):
    return address.startswith("127.") or address in ("::1", "::ffff:127.0.0.1")


def reachable_from_the_host(pid, ports):
    """The listeners of the job's `ports` that a process outside the task's namespace (the
    host, another host) can connect to: every listener in the host's namespace (the host
    reaches its own loopback) and, when the task shares it, the task's; a listener in a
    private namespace is reachable only when that namespace has an interface besides lo."""
    host = os.readlink("/proc/self/ns/net")
    mine = os.readlink(f"/proc/{pid}/ns/net")
    found = [(a, p) for a, p in listeners("/proc/self/net") if p in ports]
    if mine != host and interfaces(f"/proc/{pid}/net") != ["lo"]:
        own = listeners(f"/proc/{pid}/net")
        found += [(a, p) for a, p in own if p in ports and not _loopback(a)]
    return found


HOLD = """
import json, os, sys, time
import tfdist
strategy = tfdist.make_strategy()
import tensorflow as tf
total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
port = int(config["cluster"][task["type"]][task["index"]].rsplit(":", 1)[1])
out = os.path.join(sys.argv[1], f"{task['type']}-{task['index']}")
with open(out + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), "port": port, "total": float(total)}, f)
os.replace(out + ".tmp", out + ".json")
while not os.path.exists(os.path.join(sys.argv[1], "release")):
    time.sleep(0.1)
print("released", flush=True)
"""


def _hold_job(tmp_path, env):
    """Starts `tfdist launch --workers 2` of HOLD; returns (launcher, {task: info})."""
    import json

    script = _script(tmp_path, HOLD, "hold.py")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tfdist", "launch", "--workers", "2", script, str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 240
    while len(list(tmp_path.glob("worker-*.json"))) < 2:
        if launcher.poll() is not None or time.monotonic() > deadline:
            _stop(launcher)
            raise AssertionError("the job did not form:\n" + launcher.stdout.read())
        time.sleep(0.2)
    infos = {f.stem: json.loads(f.read_text()) for f in tmp_path.glob("worker-*.json")}
    return launcher, infos


def _stop(launcher):
    """SIGTERM, which the launcher passes on to every task (SIGKILL would orphan them)."""
    if launcher.poll() is None:
        launcher.terminate()
        launcher.wait(timeout=60)


def _release(tmp_path, launcher):
    (tmp_path / "release").write_text("")
    try:
        output = launcher.communicate(timeout=120)[0]
    finally:
        _stop(launcher)
    return output


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
def test_a_launched_job_listens_where_no_other_host_reaches_it(tmp_path):
    launcher, infos = _hold_job(tmp_path, _env(PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        ports = {info["port"] for info in infos.values()}
        for name, info in infos.items():
            pid = info["pid"]
            assert info["total"] == 2.0  # the workers met on loopback, as before
            own = listeners(f"/proc/{pid}/net")
            assert any(p == info["port"] for _, p in own), (name, own)  # its server listens ...
            assert reachable_from_the_host(pid, ports) == [], name  # ... where no host reaches
            assert interfaces(f"/proc/{pid}/net") == ["lo"]
            assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
            with pytest.raises(OSError):  # not even this host's loopback reaches it
                socket.create_connection(("127.0.0.1", info["port"]), timeout=2).close()
        # both tasks share one namespace: they reached each other on 127.0.0.1
        assert len({os.readlink(f"/proc/{i['pid']}/ns/net") for i in infos.values()}) == 1
    finally:
        output = _release(tmp_path, launcher)
    assert launcher.returncode == 0, output
    assert output.count("released") == 2
    assert "[tfdist] WARNING" not in output  # namespaces work here: no risk to name


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
def test_the_opt_out_runs_the_job_in_the_hosts_network_as_before(tmp_path):
    env = _env(PYTHONPATH=os.pathsep.join(sys.path), TFDIST_NETWORK_NAMESPACE="off")
    launcher, infos = _hold_job(tmp_path, env)
    try:
        ports = {info["port"] for info in infos.values()}
        for info in infos.values():
            assert os.readlink(f"/proc/{info['pid']}/ns/net") == os.readlink("/proc/self/ns/net")
            # TensorFlow's server: every interface, so other hosts reach it
            found = reachable_from_the_host(info["pid"], ports)
            open_to_all = [a for a, p in found if p == info["port"]]
            assert open_to_all and not [a for a in open_to_all if _loopback(a)], open_to_all
    finally:
        output = _release(tmp_path, launcher)
    assert launcher.returncode == 0, output


def where_am_i():
    import json

    import tfdist

    strategy = tfdist.make_strategy()
    config = json.loads(os.environ["TF_CONFIG"])
    task = config["task"]
    port = int(config["cluster"][task["type"]][task["index"]].rsplit(":", 1)[1])
    return {
        "replicas": strategy.num_replicas_in_sync,
        "namespace": os.readlink("/proc/self/ns/net"),
        "interfaces": interfaces("/proc/self/net"),
        "listening": [a for a, p in listeners("/proc/self/net") if p == port],
    }


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
def test_run_cluster_tasks_share_a_private_namespace():
    runs = run_cluster(where_am_i, workers=2, timeout=240)
    values = [run.value for run in runs.values()]
    assert [v["replicas"] for v in values] == [2, 2]
    assert values[0]["namespace"] == values[1]["namespace"] != os.readlink("/proc/self/ns/net")
    for value in values:
        assert value["interfaces"] == ["lo"] and value["listening"], value


def test_tasks_of_plain_scripts_run_in_the_namespace_and_keep_their_pids(tmp_path):
    script = _script(
        tmp_path,
        """
        import os, socket
        with open(f"/proc/{os.getppid()}/stat") as f:  # the keeper's parent
            keeper_parent = f.read().rsplit(")", 1)[1].split()[1]
        print("PID", os.getpid(), keeper_parent, [n for _, n in socket.if_nameindex()])
        print("NS", os.readlink("/proc/self/ns/net"))
        """,
    )
    result = run_job(plan_job(script, workers=2), quiet=True, timeout=60)
    assert result.ok and result.isolated
    for task in result.tasks.values():
        pid_line = next(line for line in task.output if line.startswith("PID"))
        _, pid, parent, names = pid_line.split(" ", 3)
        assert int(parent) == os.getpid()  # under its keeper, a child of the launcher
        assert names == "['lo']"
    namespaces = {line for t in result.tasks.values() for line in t.output if line[:2] == "NS"}
    assert len(namespaces) == 1 and os.readlink("/proc/self/ns/net") not in next(iter(namespaces))


def test_where_namespaces_are_refused_the_job_runs_with_one_warning(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise netns.Unavailable(1, "the kernel refused new namespaces (Operation not permitted)")

    monkeypatch.setattr(netns, "create", refuse)
    monkeypatch.setattr(job_module, "_WARNED", [])
    script = _script(tmp_path, "print('ran')\n")
    out = io.StringIO()
    assert launch(script, workers=2, out=out) == {"worker:0": 0, "worker:1": 0}
    assert launch(script, workers=2, out=out) == {"worker:0": 0, "worker:1": 0}
    text = out.getvalue()
    assert text.count("WARNING") == 1, text  # said once, at the start
    first = text.splitlines()[0]
    assert first.startswith("[tfdist] WARNING: tfdist cannot start this job's tasks in a private")
    assert "listen on every interface" in first and "other hosts" in first and "HINT:" in first
    assert text.count("[worker:0] ran") == 2
    monkeypatch.setenv("TFDIST_NETWORK_NAMESPACE", "require")
    with pytest.raises(RuntimeError, match="TFDIST_NETWORK_NAMESPACE=require refuses"):
        launch(script, workers=2, out=io.StringIO())
    monkeypatch.setenv("TFDIST_NETWORK_NAMESPACE", "off")
    monkeypatch.setattr(job_module, "_WARNED", [])
    out = io.StringIO()
    launch(script, workers=1, out=out)
    assert "WARNING" not in out.getvalue()  # the user chose the host's network


def test_a_task_that_needs_the_network_is_told_why_it_has_none(tmp_path):
    script = _script(
        tmp_path,
        """
        import socket
        socket.create_connection(("192.0.2.1", 80), timeout=5)
        """,
    )
    out = io.StringIO()
    codes = launch(script, workers=1, out=out)
    assert codes == {"worker:0": 1}
    text = out.getvalue()
    assert "Network is unreachable" in text
    assert "The tasks ran in a private network namespace" in text
    assert "HINT: download what the script needs before the job, or set " in text
    assert "TFDIST_NETWORK_NAMESPACE=off" in text


def test_in_process_servers_of_a_local_cluster_warn_that_other_hosts_reach_them():
    code = textwrap.dedent(
        """
        import warnings
        warnings.simplefilter("always")
        import tfdist
        from tfdist.strategy import start_local_servers
        with warnings.catch_warnings(record=True) as caught:
            start_local_servers(tfdist.ClusterSpec.local(workers=1, ps=1))
        print("WARNED", [str(w.message) for w in caught])
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    warned = proc.stdout.split("WARNED", 1)[1]
    assert "listen on every interface" in warned and "HINT: run the program with" in warned


# ------------------------------------------------------------------------ --timeout


@pytest.mark.parametrize("value", ["-5", "0", "abc", "nan", "inf", "-0.1"])
def test_cli_refuses_a_timeout_that_is_not_a_positive_number(tmp_path, capsys, value):
    script = _script(tmp_path, "print('hi')\n")
    with pytest.raises(SystemExit) as exit_:
        main(["launch", "--timeout", value, script])
    assert exit_.value.code == 2  # like --workers 0
    err = capsys.readouterr().err
    assert f"argument --timeout: {value!r} is not a positive number of seconds" in err
    assert "HINT:" in err


def test_the_real_command_refuses_a_negative_timeout_with_exit_code_2(tmp_path):
    script = _script(tmp_path, "print('hi')\n")
    for value in ("-5", "0"):
        proc = subprocess.run(
            [sys.executable, "-m", "tfdist", "launch", "--timeout", value, script],
            capture_output=True,
            text=True,
            timeout=60,
            env=_env(),
        )
        assert proc.returncode == 2, proc.stderr
        assert f"{value!r} is not a positive number of seconds" in proc.stderr
        assert "hi" not in proc.stdout  # nothing ran


@pytest.mark.parametrize("value", [-5, 0, 0.0, float("nan"), float("inf"), "5", True])
def test_launch_refuses_a_timeout_that_is_not_a_positive_number(tmp_path, value):
    script = _script(tmp_path, "print('hi')\n")
    with pytest.raises(ValueError) as info:
        launch(script, timeout=value, out=io.StringIO())
    assert f"Received: timeout={value!r}" in str(info.value) and "HINT:" in str(info.value)


def test_a_positive_timeout_still_works(tmp_path):
    script = _script(tmp_path, "print('hi')\n")
    assert launch(script, workers=1, timeout=30, out=io.StringIO()) == {"worker:0": 0}


# ------------------------------------------------------------------------ the output

NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796148400.758070   23634 port.cc:153] oneDNN custom operations are on. You may",
    "I0000 00:00:1796148400.759555   23634 cudart_stub.cc:31] Could not find cuda drivers on your",
    "E0000 00:00:1796148414.960762   23634 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
    "CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    "E0000 00:00:1796193464.242390   32021 util.cc:131] oneDNN supports DT_HALF only on "
    "platforms with AVX-512. Falling back to the default Eigen-based implementation if present.",
    "I0000 00:00:1796148415.142312   23634 grpc_server_lib.cc:467] Started server with target: "
    "grpc://127.0.0.1:50677",
    "2026-12-01 18:06:44.175066: I tensorflow/core/util/port.cc:113] oneDNN custom operations",
    "2026-12-01 18:06:44.244359: E external/local_xla/xla/stream_executor/cuda/cuda_fft.cc:479] "
    "Unable to register cuFFT factory: Attempting to register factory for plugin cuFFT when one "
    "has already been registered",
    "W0000 00:00:1796148443.903065   25700 computation_placer.cc:177] computation placer already "
    "registered. Please check linkage and avoid linking the same target more than once.",
    "2026-12-01 18:06:57.223313: W tensorflow/compiler/tf2tensorrt/utils/py_utils.cc:38] TF-TRT "
    "Warning: Could not find TensorRT",
    "WARNING:tensorflow:Using CollectiveAllReduceStrategy eagerly has significant overhead "
    "currently. We will be working on improving this in the future, ...",
    "W1201 19:02:32.816480 140232035216256 mirrored_run.py:87] Using CollectiveAllReduceStrategy "
    "eagerly has significant overhead currently. We will be working on improving this ...",
    "W0000 00:00:1796151744.158221   29515 dataset.cc:997] Input of GeneratorDatasetOp::Dataset "
    "will not be optimized because the dataset does not implement the AsGraphDefInternal() "
    "method needed to apply optimizations.",
]
KEPT = [
    "Epoch 1/2",
    "E0000 00:00:1796147219.574727   19448 base_collective_executor.cc:252] "
    "BaseCollectiveExecutor::StartAbort DEADLINE_EXCEEDED: Deadline Exceeded",
    "2026-12-01 18:07:04.017209: E tensorflow/core/common_runtime/executor.cc:1] Some real error",
    "W0000 00:00:1796147174.551936   21384 op_kernel.cc:1857] OP_REQUIRES failed at "
    "reshape_op.h:65 : INVALID_ARGUMENT: Input to reshape is a tensor with 3 values",
    "F0000 00:00:1796147174.551936   21384 check.cc:1] Check failed: something",
    "To enable the following instructions: this is the user's line",  # not after a hidden line
    "/job:worker/replica:0/task:1",
    "Traceback (most recent call last):",
    "tensorflow.python.framework.errors_impl.InvalidArgumentError: ...",
]


def test_the_filter_hides_the_noise_and_keeps_errors():
    noise = NoiseFilter()
    assert [line for line in NOISE if not noise.is_noise(line)] == []
    noise = NoiseFilter()
    assert [line for line in KEPT if noise.is_noise(line)] == []


def test_continuation_lines_of_hidden_lines_are_hidden():
    noise = NoiseFilter()
    lines = [
        "I0000 00:00:1796148401.032265   23634 cpu_feature_guard.cc:227] This TensorFlow "
        "binary is optimized to use available CPU instructions in performance-critical ops.",
        "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild "
        "TensorFlow with the appropriate compiler flags.",
        "I0000 00:00:1796148415.251074   24501 coordination_service.cc:505] Example stragglers:",
        "/job:worker/replica:0/task:1",
        "the user's line",
    ]
    assert [noise.is_noise(line) for line in lines] == [True, True, True, True, False]


def test_a_text_proto_announced_by_a_hidden_line_is_hidden_up_to_the_next_real_line():
    noise = NoiseFilter()
    lines = [
        "I0000 00:00:1796151864.679057   31500 eager_service_impl.cc:355] SessionOptions: "
        "goo.gle/debugonly  ",
        "device_count {",
        '  key: "CPU"',
        "  value: 1",
        "}",
        "allow_soft_placement: true",
        "",
        "Epoch 1/6",
        "}",  # the user's own line, after the dump ended
    ]
    hidden = [True, True, True, True, True, True, True, False, False]
    assert [noise.is_noise(line) for line in lines] == hidden


TINY = """
import tfdist
strategy = tfdist.make_strategy()
import tensorflow as tf
total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
print("USER-OUTPUT total", float(total), flush=True)
"""

FAILING = """
import tfdist
strategy = tfdist.make_strategy()
import tensorflow as tf
print("USER-OUTPUT before the error", flush=True)
tf.reshape(tf.zeros([3]), [2])
"""

# TensorFlow's start-up line that every process prints, whatever the CPU (oneDNN's "custom
# operations are on" is printed only on CPUs where oneDNN's optimisations are on by default)
ALWAYS_PRINTED = "absl::InitializeLog"
NOISY_MARKERS = (
    "oneDNN custom operations",
    "cuInit",
    "cudart_stub",
    "absl::InitializeLog",
    "Using CollectiveAllReduceStrategy eagerly",
    "grpc_server_lib",
    "coordination_service",
)


def _launch(tmp_path, script, name, *flags, **env):
    path = _script(tmp_path, script, name)
    return subprocess.Popen(
        [sys.executable, "-m", "tfdist", "launch", "--workers", "2", *flags, path],
        env=_env(PYTHONPATH=os.pathsep.join(sys.path), **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow
def test_a_launched_job_shows_the_users_output_and_hides_tensorflows_noise(tmp_path):
    quiet = _launch(tmp_path, TINY, "quiet.py")
    verbose = _launch(tmp_path, TINY, "verbose.py", "--verbose")
    try:
        outputs = {n: p.communicate(timeout=400)[0] for n, p in (("q", quiet), ("v", verbose))}
    finally:
        _stop(quiet)
        _stop(verbose)
    assert quiet.returncode == 0 and verbose.returncode == 0, outputs
    lines = outputs["q"].splitlines()
    for task in ("worker:0", "worker:1"):
        assert f"[{task}] USER-OUTPUT total 2.0" in lines, outputs["q"]
    assert [line.split()[:4] for line in lines[-2:]] == [
        ["[tfdist]", "worker:0", "exit", "0"],
        ["[tfdist]", "worker:1", "exit", "0"],
    ], outputs["q"]
    assert not [m for m in NOISY_MARKERS if m in outputs["q"]], outputs["q"]
    shown = [line for line in lines if "USER-OUTPUT" not in line and "[tfdist]" not in line]
    assert not [line for line in shown if "tfdist: task" not in line], outputs["q"]
    # --verbose shows what was hidden
    for marker in (ALWAYS_PRINTED, "Using CollectiveAllReduceStrategy eagerly"):
        assert marker in outputs["v"], outputs["v"]
    assert "[worker:1] USER-OUTPUT total 2.0" in outputs["v"]


@pytest.mark.slow
def test_the_variable_shows_the_noise_too(tmp_path):
    proc = _launch(tmp_path, TINY, "env.py", TFDIST_VERBOSE="1")
    try:
        output = proc.communicate(timeout=400)[0]
    finally:
        _stop(proc)
    assert proc.returncode == 0, output
    assert ALWAYS_PRINTED in output


@pytest.mark.slow
def test_a_failing_tasks_error_is_never_hidden(tmp_path):
    proc = _launch(tmp_path, FAILING, "failing.py", "--log-dir", str(tmp_path / "logs"))
    try:
        output = proc.communicate(timeout=400)[0]
    finally:
        _stop(proc)
    assert proc.returncode == 1, output
    assert "USER-OUTPUT before the error" in output
    assert "Traceback (most recent call last):" in output
    assert "Input to reshape is a tensor with 3 values, but the requested shape has 2" in output
    assert "InvalidArgumentError" in output
    assert "exited with code 1; the other tasks were stopped. Its last lines:" in output
    # the log keeps every line, noise included
    log = (tmp_path / "logs" / "worker-0.log").read_text()
    assert ALWAYS_PRINTED in log
    forwarded = output.split("the other tasks were stopped. Its last lines:")[0]
    assert not [m for m in NOISY_MARKERS if m in forwarded], forwarded
