"""Mixed precision by Keras policy name: choose, apply, check, and scale the loss exactly once.

    tfdist.set_precision()                    # "auto": decided by the GPUs / the CPU's flags
    tfdist.set_precision("mixed_bfloat16")    # a Keras policy name, verbatim
    with tfdist.precision_scope("float32"):   # restores the previous policy on exit
        ...

Policy names are Keras's own ("float32", "mixed_float16", "mixed_bfloat16") plus "auto". They
apply to the Keras in use (Keras 3, or tf_keras with TF_USE_LEGACY_KERAS=1; see `tfdist.flavour`).
Set the policy *before* building the model: layers read the global policy when constructed.

Loss scaling (needed for mixed_float16 only) happens exactly once:
- `model.compile()` wraps the optimizer in a LossScaleOptimizer itself, in Keras 3
  (`auto_scale_loss=True`, the default) and in tf_keras alike, unless it is one already.
- Custom training loops (and tfdist's parameter-server loop) call `wrap_optimizer`, then
  `scale_loss` on the loss and `apply_gradients` with the gradients of the scaled loss.
`wrap_optimizer` never wraps twice, and compile() never wraps a wrapped optimizer again.

Nothing here imports TensorFlow at import time, and choosing a policy never initialises the
TensorFlow runtime (only physical devices are listed), so `set_precision` may run before
`tfdist.make_strategy()`.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import warnings
from typing import Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from tfdist import flavour, task

__all__ = [
    "POLICIES",
    "PRECISION_CHOICES",
    "auto_precision",
    "check_model_outputs",
    "choose_policy",
    "cpu_flags",
    "gpu_capabilities",
    "precision_scope",
    "set_precision",
    "scale_loss",
    "apply_gradients",
    "wrap_optimizer",
]

log = logging.getLogger("tfdist")

# Keras policy names, verbatim (keras dtype_policy.py), in the order they are documented.
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
PRECISION_CHOICES = ("auto",) + POLICIES

# /proc/cpuinfo flags that mean native bfloat16 arithmetic (Intel AMX, AVX512_BF16; on Arm,
# the BF16 extension). Without one of them TensorFlow emulates bfloat16 on a CPU.
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")

_MIXED = ("mixed_float16", "mixed_bfloat16")
_ONCE: set = set()
_ONCE_LOCK = threading.Lock()


# ------------------------------------------------------------------------- the decision


def choose_policy(
    gpu_capabilities: Sequence[Optional[Tuple[int, int]]], cpu_flags: Iterable[str]
) -> Tuple[str, str]:
    """The policy "auto" picks for these devices, and why. A pure function.

    GPUs (when there are any, they do the math): every GPU of compute capability >= 8.0
    (Ampere and newer) -> "mixed_bfloat16"; every GPU >= 7.0 (Volta, Turing) ->
    "mixed_float16"; otherwise "float32". The slowest GPU decides, since replicas step
    together. CPUs only: "mixed_bfloat16" when the CPU has native bfloat16 (amx_bf16 or
    avx512_bf16 in its flags), else "float32".

    Args:
        gpu_capabilities: list of (major, minor) compute capabilities, one per GPU replica
            device; None for a GPU whose capability is unknown. Empty for a CPU-only host.
        cpu_flags: set of /proc/cpuinfo flag names ("avx2", "amx_bf16", ...).

    Returns:
        (policy, reason): a Keras policy name and a one-line explanation.
    """
    gpus = list(gpu_capabilities)
    if gpus:
        if any(c is None for c in gpus):
            return (
                "float32",
                f"{len(gpus)} GPU(s), compute capability unknown for at least one"
                ": float32 is the safe choice (pass a policy name to override)",
            )
        slowest = min(tuple(c) for c in gpus)
        text = f"{slowest[0]}.{slowest[1]}"
        where = f"{len(gpus)} GPU(s), lowest compute capability {text}"
        if slowest >= (8, 0):
            return (
                "mixed_bfloat16",
                f"{where} >= 8.0: bfloat16 tensor cores, no loss scaling needed",
            )
        if slowest >= (7, 0):
            return (
                "mixed_float16",
                f"{where} >= 7.0: float16 tensor cores (no bfloat16); "
                "the loss is scaled dynamically",
            )
        return (
            "float32",
            f"{where} < 7.0: no tensor cores, so mixed precision would not be faster",
        )
    flags = {f.lower() for f in cpu_flags}
    native = [f for f in CPU_BF16_FLAGS if f in flags]
    if native:
        return ("mixed_bfloat16", f"CPU only, with native bfloat16 ({', '.join(native)})")
    return (
        "float32",
        "CPU only, without native bfloat16 (no amx_bf16 / avx512_bf16 flag): "
        "mixed precision would be emulated, with no speed-up over float32",
    )


# ----------------------------------------------------------------- describing this host


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> Set[str]:
    """The CPU's feature flags from /proc/cpuinfo ("flags" on x86, "Features" on Arm).

    An empty set where the file does not exist (macOS, Windows).
    """
    try:
        with open(cpuinfo) as f:
            text = f.read()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return set(value.split())
    return set()


def gpu_capabilities(devices: Optional[Sequence[str]] = None) -> List[Optional[Tuple[int, int]]]:
    """Compute capabilities of the GPUs replicas would use (physical devices only).

    Args:
        devices: list of device strings. GPUs among them select physical GPUs by index; a
            list without GPUs means the replicas run on CPUs ([]). Defaults to every GPU.

    Returns:
        list of (major, minor), None where TensorFlow does not report one.
    """
    import tensorflow as tf

    physical = tf.config.list_physical_devices("GPU")
    if devices is not None:
        indexes = [
            int(m.group(1)) for m in (re.search(r"gpu:(\d+)$", d.lower()) for d in devices) if m
        ]
        physical = [physical[i] for i in indexes if i < len(physical)] if physical else []
    capabilities = []
    for gpu in physical:
        try:
            capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
        except Exception:  # pylint: disable=broad-except  (details are best effort)
            capability = None
        capabilities.append(tuple(capability) if capability else None)
    return capabilities


def auto_precision(devices: Optional[Sequence[str]] = None) -> dict:
    """What "auto" picks on this host, for reports (`tfdist env`).

    Returns:
        dict: {"policy", "reason", "gpu_capabilities", "cpu_bf16_flags"}.
    """
    capabilities = gpu_capabilities(devices)
    flags = cpu_flags()
    policy, reason = choose_policy(capabilities, flags)
    return {
        "policy": policy,
        "reason": reason,
        "gpu_capabilities": [list(c) if c else None for c in capabilities],
        "cpu_bf16_flags": sorted(f for f in CPU_BF16_FLAGS if f in flags),
    }


# ------------------------------------------------------------------------ applying it


def _once(key) -> bool:
    """True the first time `key` is seen in this process, and only on the chief."""
    with _ONCE_LOCK:
        if key in _ONCE:
            return False
        _ONCE.add(key)
    return task.is_chief()


def _canonical_policy(policy) -> str:
    if not isinstance(policy, str):
        raise TypeError(
            f"The precision policy must be a string. Received: policy={policy!r} (of type "
            f"{type(policy).__name__}). HINT: choose one of: {', '.join(PRECISION_CHOICES)}."
        )
    key = policy.strip().lower().replace("-", "_")
    if key not in PRECISION_CHOICES:
        raise ValueError(
            f"policy={policy!r} is not a known precision policy. Choose one of: "
            f"{', '.join(PRECISION_CHOICES)} (Keras policy names)."
        )
    return key


def _cost_warning(policy: str, capabilities: list, flags: Set[str]) -> Optional[str]:
    """Why `policy` will be slow on these devices, or None."""
    if capabilities:
        known = [c for c in capabilities if c is not None]
        if policy == "mixed_bfloat16" and known and min(known) < (8, 0):
            return (
                "precision 'mixed_bfloat16' on a GPU of compute capability "
                f"{min(known)[0]}.{min(known)[1]} (< 8.0, no bfloat16 tensor cores): "
                "expect it to be slower than float32. HINT: use 'mixed_float16' or "
                "'auto'."
            )
        return None
    if policy == "mixed_float16":
        return (
            "precision 'mixed_float16' on a host without GPUs: CPUs have no fast "
            "float16 arithmetic, so TensorFlow converts to and from float16 around the "
            "ops and dynamic loss scaling adds an all-finite check every step. Expect no "
            "speed-up over float32 (often a slowdown), with float16's narrow range and "
            "precision as the price. HINT: use 'float32' or 'auto' (or 'mixed_bfloat16' "
            "on CPUs with amx_bf16 / avx512_bf16)."
        )
    if policy == "mixed_bfloat16" and not any(f in flags for f in CPU_BF16_FLAGS):
        return (
            "precision 'mixed_bfloat16' on a CPU without native bfloat16 (no amx_bf16 "
            "/ avx512_bf16 flag): TensorFlow emulates bfloat16 arithmetic, so expect no "
            "speed-up over float32, only less precision. HINT: use 'float32' or 'auto' "
            "on this host."
        )
    return None


def set_precision(policy: str = "auto", *, devices: Optional[Sequence[str]] = None) -> str:
    """Sets the global Keras dtype policy, and returns its name.

    Call it before building the model (layers read the global policy when constructed), in
    every process of a job; the choice and its reason are logged once, by the chief only.

    Args:
        policy: str. "auto", "float32", "mixed_float16" or "mixed_bfloat16" (Keras policy
            names). "auto": see `choose_policy`. Defaults to "auto".
        devices: list of device strings the replicas run on ("/gpu:0", "/cpu:0"), for "auto"
            and the cost checks. Defaults to every local GPU, else the CPU.

    Returns:
        str: the Keras policy name applied.

    Raises:
        TypeError: `policy` is not a string.
        ValueError: `policy` is not one of the names above.

    Warns:
        UserWarning: (chief only, once) a mixed policy these devices would run slowly, such
            as mixed_float16 on a host without GPUs.
    """
    return _set_precision(policy, devices, stacklevel=3)


def _set_precision(policy, devices, stacklevel: int) -> str:
    key = _canonical_policy(policy)
    capabilities = gpu_capabilities(devices)
    flags = cpu_flags()
    if key == "auto":
        name, reason = choose_policy(capabilities, flags)
        reason = f"auto: {reason}"
    else:
        name, reason = key, "requested"
    _apply(name)
    if _once(("chosen", name, reason)):
        log.info("tfdist: precision policy %r (%s).", name, reason)
    message = _cost_warning(name, capabilities, flags)
    if message and _once(("cost", message)):
        warnings.warn(message, UserWarning, stacklevel=stacklevel)
    return name


def _apply(name: str) -> None:
    flavour.keras().mixed_precision.set_global_policy(name)


def current_policy() -> str:
    """The name of the global Keras dtype policy now in force."""
    return flavour.keras().mixed_precision.global_policy().name


@contextlib.contextmanager
def precision_scope(policy: str, *, devices: Optional[Sequence[str]] = None) -> Iterator[str]:
    """Applies `policy` (as `set_precision` does) inside the block, and restores the previous
    global policy on exit, also when the block raises.

    Example:

    ```python
    with tfdist.precision_scope("mixed_bfloat16") as name:
        model = build_model()          # layers compute in bfloat16, variables stay float32
    ```

    Yields:
        str: the Keras policy name applied.
    """
    previous = flavour.keras().mixed_precision.global_policy()
    try:
        # stacklevel: _set_precision <- precision_scope <- contextlib __enter__ <- the caller
        yield _set_precision(policy, devices, stacklevel=5)
    finally:
        flavour.keras().mixed_precision.set_global_policy(previous)


# ------------------------------------------------------------------------- model checks


def _dtype_name(dtype) -> str:
    name = getattr(dtype, "name", dtype)
    return str(name)


def _policy_name(model) -> str:
    policy = getattr(model, "dtype_policy", None)
    name = getattr(policy, "name", None)
    return name if isinstance(name, str) else current_policy()


def check_model_outputs(model) -> list:
    """Warns (chief only, once per model) when a mixed-precision model outputs 16-bit floats.

    Under mixed precision the last layer should compute in float32, so that the loss (and,
    for softmax, its normalisation) is not computed in float16 / bfloat16: give it
    `dtype="float32"`, or end with `keras.layers.Activation("linear", dtype="float32")`.

    Args:
        model: a Keras model (Keras 3 or tf_keras), built.

    Returns:
        list of (output name, dtype name) for the outputs that are 16-bit floats (empty when
        the model is fine, or not under a mixed policy).
    """
    if _policy_name(model) not in _MIXED and current_policy() not in _MIXED:
        return []
    found = []
    try:
        outputs = list(getattr(model, "outputs", None) or [])
        names = list(getattr(model, "output_names", None) or [])
        if len(names) != len(outputs):
            names = [f"output_{i}" for i in range(len(outputs))]
        found = [(name, _dtype_name(tensor.dtype)) for name, tensor in zip(names, outputs)]
    except (AttributeError, ValueError):
        found = []
    if not found:  # a subclassed model: judge by its last layer's compute dtype
        layers = getattr(model, "layers", None) or []
        if layers:
            last = layers[-1]
            found = [(last.name, _dtype_name(getattr(last, "compute_dtype", "float32")))]
    bad = [(name, dtype) for name, dtype in found if dtype in ("float16", "bfloat16")]
    if bad and _once(("outputs", id(model))):
        listed = ", ".join(f"{name} ({dtype})" for name, dtype in bad)
        warnings.warn(
            f"Model {getattr(model, 'name', '')!r} under precision "
            f"{_policy_name(model)!r} outputs 16-bit floats: {listed}. The loss would be "
            "computed in low precision (float16 can also overflow). HINT: give the last "
            "layer dtype='float32', or end the model with "
            "keras.layers.Activation('linear', dtype='float32').",
            UserWarning,
            stacklevel=2,
        )
    return bad


# ----------------------------------------------------------------------- loss scaling


def _loss_scale_classes() -> tuple:
    keras = flavour.keras()
    if flavour.uses_legacy_keras():
        from tf_keras.src.mixed_precision import loss_scale_optimizer as lso

        return (lso.BaseLossScaleOptimizer,)
    return (keras.optimizers.LossScaleOptimizer,)


def is_loss_scaled(optimizer) -> bool:
    """True when `optimizer` is a Keras LossScaleOptimizer (of the Keras in use)."""
    return isinstance(optimizer, _loss_scale_classes())


def wrap_optimizer(optimizer, *, policy: Optional[str] = None):
    """Wraps `optimizer` in a LossScaleOptimizer when the policy needs it, never twice.

    Only "mixed_float16" needs loss scaling. `model.compile()` already does this (Keras 3
    with `auto_scale_loss=True`, and tf_keras), and does not wrap a wrapped optimizer again,
    so calling this before compile is harmless. Custom training loops must call it, then use
    `scale_loss` and `apply_gradients`.

    Args:
        optimizer: a Keras optimizer, or its name ("adam").
        policy: str. The model's policy name. Defaults to the global policy.

    Returns:
        The optimizer itself, or a LossScaleOptimizer wrapping it.
    """
    keras = flavour.keras()
    optimizer = keras.optimizers.get(optimizer)
    name = policy if policy is not None else current_policy()
    if name != "mixed_float16" or is_loss_scaled(optimizer):
        return optimizer
    return keras.mixed_precision.LossScaleOptimizer(optimizer)


def scale_loss(optimizer, loss):
    """The loss to differentiate in a custom loop: scaled when `optimizer` scales the loss."""
    if not is_loss_scaled(optimizer):
        return loss
    if flavour.uses_legacy_keras():
        return optimizer.get_scaled_loss(loss)
    return optimizer.scale_loss(loss)


def apply_gradients(optimizer, gradients, variables) -> None:
    """Applies the gradients of `scale_loss(optimizer, loss)` to `variables`.

    With a LossScaleOptimizer the gradients are unscaled, and a step whose gradients are not
    finite is skipped (and the scale lowered) instead of writing inf / NaN into the weights.
    Call it in replica context (inside `strategy.run`), like `optimizer.apply_gradients`.
    """
    gradients, variables = list(gradients), list(variables)
    if flavour.uses_legacy_keras():
        if is_loss_scaled(optimizer):
            gradients = optimizer.get_unscaled_gradients(gradients)
        optimizer.apply_gradients(zip(gradients, variables))
        return
    if is_loss_scaled(optimizer):
        # Keras 3's LossScaleOptimizer decides "skip this step" per replica; the fix
        # loss_scale_skip_agreed_by_all_replicas makes it one decision for all replicas.
        from tfdist.fixes import apply_fixes

        apply_fixes()
    optimizer.apply(gradients, variables)  # Keras 3's LossScaleOptimizer unscales itself
