"""The steps of the prepared GPU check (`make test-gpu`, tests/gpu/gpu_check.py), one per
process: `python tests/gpu/gpu_steps.py NAME` runs step NAME and prints one line,
`GPU_STEP {json}`, with its outcome ("ok" or "failed"), what it measured, and the error.

Every step first checks what it needs (TensorFlow sees a GPU; enough memory for two logical
GPUs) and fails with that, rather than running on the CPU by mistake; a step that does not
apply to this GPU (bfloat16 below compute capability 8.0) is "skipped", with the reason. What
a step starts (a `tfdist launch` job, a process of its own) is bounded within the step's own
limit (TFDIST_GPU_STEP_SECONDS, which gpu_check.py sets; else the step's limit there), so that
it ends, and the step reports, before the check stops the step. With
TFDIST_GPU_CHECK_REHEARSE=1 the same steps run on this host's CPUs (logical CPUs for logical
GPUs, a simulated GPU for the launcher), so that the check's own code is tested where there
is no GPU (tests/cluster/test_gpu_check_rehearsal.py).

Needs TensorFlow, Keras and tfdist; tf_keras for the tf_keras step.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback

MARK = "GPU_STEP "
REHEARSE = os.environ.get("TFDIST_GPU_CHECK_REHEARSE") == "1"
LOGICAL_MIB = 2048  # each of the two logical GPUs carved from the one GPU
LIMIT_VARIABLE = "TFDIST_GPU_STEP_SECONDS"  # the step's limit (gpu_check.py sets it)
REPORT_SECONDS = 5  # what a step keeps of its limit to end what it started and report
LAUNCH_GRACE = 5  # the check's job: its tasks' seconds between SIGTERM and SIGKILL
BF16_CAPABILITY = (8, 0)  # bfloat16 on GPUs: Ampere and newer
_deadline = None  # time.monotonic() when the step's limit is up (`start_clock`)


class Skipped(Exception):
    """A step that does not apply to this GPU; the message says why."""


def start_clock(limit):
    """The step's limit starts now: what it starts ends `REPORT_SECONDS` before it."""
    global _deadline
    _deadline = time.monotonic() + float(limit)


def child_seconds(what, least=10):
    """Seconds a process the step starts may take: what is left of the step's limit but
    `REPORT_SECONDS`. Raises where fewer than `least` are left (the check cut the limit)."""
    left = _deadline - time.monotonic() if _deadline is not None else float("inf")
    seconds = left - REPORT_SECONDS
    if seconds < least:
        raise RuntimeError(f"{left:.0f} s left of the step's limit: too few for {what}")
    return seconds


def job_limits(what):
    """(`tfdist launch --timeout`, the launcher process's timeout) for a job the step starts:
    the job's limit, then `LAUNCH_GRACE` s for its tasks to stop and `REPORT_SECONDS` for the
    launcher to report, all before the process's timeout, which is within the step's."""
    process = child_seconds(what, least=REPORT_SECONDS + LAUNCH_GRACE + 20)
    return process - LAUNCH_GRACE - REPORT_SECONDS, process


def _tf():
    import tensorflow as tf

    return tf


def need_gpu():
    """The physical GPUs TensorFlow sees; raises where it sees none (on a GPU host)."""
    tf = _tf()
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus and not REHEARSE:
        raise RuntimeError(
            "TensorFlow sees no GPU (built with CUDA: "
            f"{tf.test.is_built_with_cuda()}); `tfdist env` says why"
        )
    return gpus


def two_logical_devices():
    """Two logical GPUs carved from the first GPU (rehearsal: two logical CPUs)."""
    tf = _tf()
    if REHEARSE:
        import tfdist

        return tfdist.virtual_cpus(2)
    gpu = need_gpu()[0]
    total = _gpu_memory_mib()
    if total is not None and total < 2 * LOGICAL_MIB + 1024:
        raise RuntimeError(f"the GPU has {total} MiB; two logical GPUs of {LOGICAL_MIB} need more")
    config = tf.config.LogicalDeviceConfiguration(memory_limit=LOGICAL_MIB)
    tf.config.set_logical_device_configuration(gpu, [config, config])
    return ["/gpu:0", "/gpu:1"]


def _gpu_memory_mib(env=None):
    """The memory (MiB) of the GPU the step runs on, as nvidia-smi says: the first that
    CUDA_VISIBLE_DEVICES names (an index, with CUDA_DEVICE_ORDER=PCI_BUS_ID as gpu_check.py
    sets it, a UUID or a MIG name: what `nvidia-smi -i` takes; "0" where it is unset), or
    None where nvidia-smi does not say."""
    env = os.environ if env is None else env
    named = [e.strip() for e in env.get("CUDA_VISIBLE_DEVICES", "0").split(",") if e.strip()]
    tool = shutil.which("nvidia-smi", path=env.get("PATH"))
    if not named or tool is None:
        return None
    command = [tool, "-i", named[0], "--query-gpu=memory.total", "--format=csv,noheader,nounits"]
    try:
        listed = subprocess.run(command, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    first = listed.stdout.strip().splitlines()[:1]
    return int(first[0].strip()) if first and first[0].strip().isdigit() else None


def _compute_capability():
    """(major, minor) of the first GPU TensorFlow sees, or None where it does not say."""
    tf = _tf()
    details = tf.config.experimental.get_device_details(need_gpu()[0])
    capability = details.get("compute_capability")
    return tuple(capability) if capability else None


def bf16_skip_reason(capability):
    """Why mixed_bfloat16 is not for a GPU of `capability` ((major, minor) or None), or None."""
    if capability is not None and tuple(capability) >= BF16_CAPABILITY:
        return None
    found = "none reported" if capability is None else ".".join(str(p) for p in capability)
    need = ".".join(str(p) for p in BF16_CAPABILITY)
    return f"needs compute capability {need}, found {found}"


def _data(n=512, features=16, classes=4, seed=0):
    import numpy as np

    rng = np.random.RandomState(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    w = rng.normal(size=(features, classes)).astype("float32")
    y = (x @ w).argmax(axis=1).astype("int32")
    return x, y


def _model(keras, features=16, classes=4, width=64):
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((features,)),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(classes, dtype="float32"),  # logits in float32 under mixed
        ]
    )


def _fit_converges(strategy, epochs=6, **compile_kwargs):
    """Fits the small classifier under `strategy`; returns its first and last loss, checked."""
    from tfdist import flavour

    keras = flavour.keras()
    x, y = _data()
    with strategy.scope():
        model = _model(keras)
        model.compile(
            optimizer=keras.optimizers.Adam(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            **compile_kwargs,
        )
    history = model.fit(x, y, batch_size=64, epochs=epochs, verbose=0).history
    first, last = history["loss"][0], history["loss"][-1]
    if not last < 0.6 * first:
        raise AssertionError(f"the loss did not fall enough: {history['loss']}")
    return model, {
        "loss_first": round(first, 4),
        "loss_last": round(last, 4),
        "accuracy_last": round(history["accuracy"][-1], 4),
        "replicas": strategy.num_replicas_in_sync,
        "devices": list(strategy.extended.worker_devices),
    }


# ------------------------------------------------------------------------------------ steps
def step_devices():
    """What TensorFlow sees and was built with."""
    tf = _tf()
    import tfdist
    from tfdist import flavour

    gpus = need_gpu()
    build = tf.sysconfig.get_build_info()
    out = {
        "versions": flavour.versions(),
        "tfdist": tfdist.__version__,
        "gpus": [],
        "cuda": build.get("cuda_version"),
        "cudnn": build.get("cudnn_version"),
        "built_with_cuda": tf.test.is_built_with_cuda(),
    }
    for gpu in gpus:
        details = tf.config.experimental.get_device_details(gpu)
        out["gpus"].append(
            {
                "device": gpu.name,
                "name": details.get("device_name"),
                "compute_capability": details.get("compute_capability"),
            }
        )
    return out


def step_one_device_fit():
    """fit under make_strategy() on the one GPU ("auto": one_device)."""
    need_gpu()
    import tfdist

    strategy = tfdist.make_strategy("one_device" if REHEARSE else "auto")
    _, out = _fit_converges(strategy)
    from tfdist import flavour

    out.update(strategy=type(strategy).__name__, versions=flavour.versions())
    if not REHEARSE and not all("GPU" in d for d in out["devices"]):
        raise AssertionError(f"the replicas are not on the GPU: {out['devices']}")
    return out


def step_one_device_fit_tf_keras():
    """The same under tf_keras (TF_USE_LEGACY_KERAS=1, in a process of its own)."""
    return _in_subprocess("one_device_fit", {"TF_USE_LEGACY_KERAS": "1"})


def step_mirrored_two_logical_gpus():
    """mirrored over 2 logical GPUs of the one GPU: weights equal to one device's."""
    import numpy as np

    tf = _tf()
    devices = two_logical_devices()
    tf.config.experimental.enable_tensor_float_32_execution(False)  # exact float32 matmuls
    import tfdist
    from tfdist import flavour

    keras = flavour.keras()
    x, y = _data()
    weights = {}
    for name, strategy in (
        ("one_device", tfdist.make_strategy("one_device", devices=devices[:1])),
        ("mirrored", tfdist.make_strategy("mirrored", devices=devices)),
    ):
        with strategy.scope():
            model = _model(keras)
            model.compile(
                optimizer=keras.optimizers.SGD(0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
        weights[name] = [np.asarray(w) for w in model.get_weights()]
        if name == "mirrored":
            replicas = strategy.num_replicas_in_sync
            reduction = type(strategy.extended._cross_device_ops).__name__  # noqa: SLF001
    worst = max(
        float(np.max(np.abs(a - b))) for a, b in zip(weights["one_device"], weights["mirrored"])
    )
    if replicas != 2:
        raise AssertionError(f"mirrored made {replicas} replicas, not 2")
    if not worst < 1e-4:
        raise AssertionError(f"the weights differ from one device's by up to {worst:.3g}")
    drop = _drop_device_iterators(tf, strategy)
    if not drop < 0.25:  # fix device_iterators_dropped_at_once, on the devices' own pipelines
        raise AssertionError(f"dropping the per-device iterators took {drop} s")
    return {
        "replicas": replicas,
        "cross_device_ops": reduction,
        "max_weight_difference": worst,
        "device_iterators_dropped_in_seconds": drop,
    }


def _drop_device_iterators(tf, strategy, ages=(0.75, 1.4)):
    """The longest drop, in seconds, of the per-device parts of a distributed dataset's
    iterators, each read for one of `ages` seconds first (upstream, often about as long again:
    their autotuning threads sleep on)."""
    data = tf.data.Dataset.from_tensor_slices(tf.zeros((64, 4))).batch(8).repeat()
    dataset = strategy.experimental_distribute_dataset(data)

    @tf.function
    def step(iterator):
        return strategy.run(tf.reduce_sum, args=(next(iterator),))

    longest = 0.0
    for age in ages:
        iterator = iter(dataset)
        started = time.monotonic()
        while time.monotonic() - started < age:
            step(iterator)
        parts = []
        for worker in iterator._iterators:  # noqa: SLF001 (each owns a MultiDeviceIterator)
            parts += worker._iterator._device_iterators  # noqa: SLF001
            worker._iterator._device_iterators = []  # noqa: SLF001
        dropped = time.monotonic()
        del parts
        longest = max(longest, round(time.monotonic() - dropped, 3))
        del iterator
    return longest


def step_mixed_bfloat16_fit():
    """fit under mixed_bfloat16 converges; the layers compute in bfloat16. Skipped on a GPU
    below compute capability 8.0 (no bfloat16 there)."""
    if not REHEARSE:
        reason = bf16_skip_reason(_compute_capability())
        if reason:
            raise Skipped(reason)
    return _mixed("mixed_bfloat16", "bfloat16")


def step_mixed_float16_fit():
    """fit under mixed_float16 converges, with loss scaling."""
    out = _mixed("mixed_float16", "float16")
    if "LossScale" not in out["optimizer"]:
        raise AssertionError(f"mixed_float16 without loss scaling: {out['optimizer']}")
    return out


def _mixed(policy, dtype):
    need_gpu()
    import warnings

    import tfdist

    strategy = tfdist.make_strategy("one_device" if REHEARSE else "auto")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mixed_float16 on CPUs (the rehearsal) is slow: known
        applied = tfdist.set_precision(policy)
    model, out = _fit_converges(strategy)
    compute = model.layers[0].compute_dtype
    if compute != dtype:
        raise AssertionError(f"the first layer computes in {compute}, not {dtype}")
    out.update(policy=applied, compute_dtype=compute, optimizer=type(model.optimizer).__name__)
    from tfdist.precision import auto_precision

    out["auto_picks"] = auto_precision()  # what "auto" would choose on this GPU, and why
    return out


def step_jit_compile_fit():
    """fit with jit_compile=True (XLA) converges."""
    need_gpu()
    import tfdist

    strategy = tfdist.make_strategy("one_device" if REHEARSE else "auto")
    _, out = _fit_converges(strategy, jit_compile=True)
    return out


def step_slurm_gpu_share():
    """A SLURM task of 2 on a node with this one GPU: it keeps the GPU, grows its memory
    (`tfdist.strategy.devices.take_slurm_gpu_share`, what make_strategy does first) and
    all-reduces on the ring where communication is "auto" (NCCL refuses one GPU twice)."""
    tf = _tf()
    from tfdist.strategy.communication import collective_implementation
    from tfdist.strategy.devices import slurm_tasks_share_gpus, take_slurm_gpu_share

    gpus = need_gpu()
    slurm = {"SLURM_STEP_ID": "0", "SLURM_LOCALID": "1", "SLURM_NODEID": "0"}
    env = dict(slurm, SLURM_STEP_TASKS_PER_NODE="2")
    kept = take_slurm_gpu_share(env)
    if REHEARSE:
        if kept is not None:
            raise AssertionError(f"a host without GPUs kept {kept}")
        return {"kept": kept}
    growth = [tf.config.experimental.get_memory_growth(g) for g in gpus]
    visible = tf.config.get_visible_devices("GPU")
    auto = collective_implementation("auto", kept or [], slurm_tasks_share_gpus(env, len(gpus)))
    if len(gpus) == 1 and (
        kept != ["/gpu:0"] or growth != [True] or visible != gpus or auto != "ring"
    ):
        raise AssertionError(
            f"kept {kept}, memory growth {growth}, visible {visible}, 'auto' all-reduce {auto}"
        )
    tf.constant(1.0)  # the runtime starts with the share
    return {
        "kept": kept,
        "memory_growth": growth,
        "physical_gpus": len(gpus),
        "auto_all_reduce": auto,
    }


MULTI_WORKER_SCRIPT = """
    import json, os
    import numpy as np
    import tensorflow as tf
    import tfdist

    strategy = tfdist.make_strategy()
    import gpu_steps

    model, out = gpu_steps._fit_converges(strategy)
    out.update(
        strategy=type(strategy).__name__,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        memory_growth=os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH"),
        communication=os.environ.get("TFDIST_COMMUNICATION"),
        gpus_seen=len(tf.config.list_physical_devices("GPU")),
    )
    if out["gpus_seen"]:
        out["peak_memory_mib"] = round(
            tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20, 1
        )
    out["weights_sum"] = float(sum(np.sum(w) for w in model.get_weights()))
    print("WORKER " + json.dumps(out), flush=True)
"""


def step_multi_worker_two_processes():
    """`tfdist launch --workers 2 --gpus-per-worker shared` on the one GPU: two processes,
    each with the memory it uses, all-reducing on the ring; both end with the same weights."""
    if not REHEARSE:
        need_gpu()
    with tempfile.TemporaryDirectory(prefix="tfdist-gpu-check-") as directory:
        script = os.path.join(directory, "train.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(MULTI_WORKER_SCRIPT))
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([_HERE, os.environ.get("PYTHONPATH", "")])
        )
        if REHEARSE:
            env["TFDIST_GPUS"] = "1"  # the launcher plans as for one GPU
        job, process = job_limits("a 2-process job")
        command = [sys.executable, "-m", "tfdist", "launch", "--workers", "2"]
        command += ["--gpus-per-worker", "shared", "--timeout", f"{job:.0f}"]
        command += ["--grace", f"{LAUNCH_GRACE}", script]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=process)
    workers = [
        json.loads(line.split("WORKER ", 1)[1])
        for line in done.stdout.splitlines()
        if "WORKER " in line
    ]
    if done.returncode != 0 or len(workers) != 2:
        tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
        raise AssertionError(f"exit code {done.returncode}; last lines:\n" + "\n".join(tail))
    for worker in workers:
        if worker["strategy"] != "CollectiveAllReduceStrategy":
            raise AssertionError(f"a worker trained under {worker['strategy']}")
        if worker["memory_growth"] != "true" or worker["communication"] != "ring":
            raise AssertionError(f"a worker that shares the GPU got {worker}")
        if not REHEARSE and not worker["gpus_seen"]:
            raise AssertionError("a worker saw no GPU")
    if abs(workers[0]["weights_sum"] - workers[1]["weights_sum"]) > 1e-4:
        raise AssertionError(f"the workers' weights differ: {workers}")
    return {"workers": workers}


def step_nccl_two_logical_gpus():
    """An NCCL all-reduce between 2 logical GPUs of the one GPU: the outcome, whatever it is
    (NCCL may refuse two ranks on one GPU). "ok" means the attempt ran and was recorded."""
    from tfdist.cli import nccl_check

    if REHEARSE:
        arguments = ["--cpus", "2", "--communication", "reduce_to_one_device"]
    else:
        need_gpu()
        arguments = ["--logical", "2", "--memory-mib", str(LOGICAL_MIB)]
    result = nccl_check.run(arguments, timeout=child_seconds("the NCCL check"))
    return {"nccl_outcome": result["outcome"], "nccl": result}


def step_fit_against_custom_loop():
    """Steps per second of fit (the plain idiom, under make_strategy()) and of a custom loop
    of the same model, optimizer and data: median of 3 alternating rounds, and their ratio."""
    need_gpu()
    tf = _tf()
    import tfdist
    from tfdist import flavour

    keras = flavour.keras()
    width, batch, steps = (64, 64, 40) if REHEARSE else (2048, 1024, 200)
    import numpy as np

    rng = np.random.RandomState(0)
    x = rng.normal(size=(batch * 8, width)).astype("float32")
    y = rng.randint(0, 10, size=(batch * 8,)).astype("int32")
    strategy = tfdist.make_strategy("one_device" if REHEARSE else "auto")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
    data = data.cache().repeat().prefetch(tf.data.AUTOTUNE)

    def build():
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential(
                [keras.Input((width,))]
                + [keras.layers.Dense(width, activation="relu") for _ in range(3)]
                + [keras.layers.Dense(10)]
            )
            model.compile(
                optimizer=keras.optimizers.SGD(0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        return model

    fit_model, loop_model = build(), build()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    iterator = iter(strategy.experimental_distribute_dataset(data))

    @tf.function
    def loop_steps(n):
        def one(inputs):
            features, labels = inputs
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, loop_model(features, training=True))
            grads = tape.gradient(loss, loop_model.trainable_variables)
            loop_model.optimizer.apply_gradients(zip(grads, loop_model.trainable_variables))
            return loss

        for _ in tf.range(n):
            strategy.run(one, args=(next(iterator),))

    def fit_round():
        started = time.perf_counter()
        fit_model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)
        return steps / (time.perf_counter() - started)

    def loop_round():
        started = time.perf_counter()
        loop_steps(tf.constant(steps))
        float(loop_model.optimizer.iterations.numpy())  # waits for the last step
        return steps / (time.perf_counter() - started)

    fit_round(), loop_round()  # compile both
    fits, loops = [], []
    for _ in range(3):
        fits.append(fit_round())
        loops.append(loop_round())
    fit_rate, loop_rate = sorted(fits)[1], sorted(loops)[1]
    return {
        "model": f"MLP {width} x 3, batch {batch}, {steps} steps a round",
        "fit_steps_per_s": round(fit_rate, 1),
        "custom_loop_steps_per_s": round(loop_rate, 1),
        "ratio_fit_to_loop": round(fit_rate / loop_rate, 3),
    }


_HERE = os.path.dirname(os.path.abspath(__file__))


def _in_subprocess(step, extra_env):
    seconds = child_seconds(f"step {step}")
    env = dict(os.environ, **extra_env)
    env[LIMIT_VARIABLE] = f"{seconds - REPORT_SECONDS:g}"  # within this process's timeout
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), step],
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds,
    )
    result = parse(done.stdout)
    if result is None or result["outcome"] != "ok":
        error = (result or {}).get("error") or (done.stdout + done.stderr)[-2000:]
        raise AssertionError(f"{step} under {extra_env}: {error}")
    return result


STEPS = {
    name[len("step_") :]: function
    for name, function in list(globals().items())
    if name.startswith("step_") and callable(function)
}


def parse(output):
    """The result of a step from its output, or None."""
    for line in reversed(output.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    return None


def main(argv):
    if len(argv) != 1 or argv[0] not in STEPS:
        print(f"usage: gpu_steps.py STEP, one of: {', '.join(STEPS)}", file=sys.stderr)
        return 2
    name = argv[0]
    started = time.perf_counter()
    start_clock(os.environ.get(LIMIT_VARIABLE) or _own_limit(name))
    try:
        result = {"outcome": "ok", **STEPS[name]()}
    except Skipped as why:
        result = {"outcome": "skipped", "reason": str(why)}
    except Exception as err:  # noqa: BLE001 - a failing step is a result too
        traceback.print_exc()
        result = {"outcome": "failed", "error": f"{type(err).__name__}: {err}"[:3000]}
    result["step_seconds"] = round(time.perf_counter() - started, 2)
    print(MARK + json.dumps(result, default=str), flush=True)
    return 0 if result["outcome"] in ("ok", "skipped") else 1


def _own_limit(name):
    """The step's limit in gpu_check.py (run by hand, without the check)."""
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    import gpu_check

    return gpu_check.STEPS[name][0]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
