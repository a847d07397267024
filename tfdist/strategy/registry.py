"""The strategies tfdist makes, one record each: the single source of every strategy fact.

A `Strategy` record says what the rest of tfdist needs to know about a strategy: its names, the
TensorFlow class it builds, its builder, the `communication=` values and options it takes,
whether it runs in one process or many, uses a ps job, all-reduces gradients (and so takes
gradient compression), when "auto" picks it, which tasks only serve, which `tfdist.testing`
pool serves it, and its docs page. Everything else derives from `STRATEGIES`:
`resolve_strategy_name`'s "auto" and the names a cluster contradicts, `make_strategy`'s checks,
the CLI's `--strategy` choices, the check of TFDIST_STRATEGY, gradient compression's accepted
strategies and messages, the testing pools, and the docs' tables (`markdown_table`,
`markdown_auto`; tests/unit/test_strategy_registry.py checks the docs against them).

"auto" is not a strategy but a decision (`tfdist.strategy.factory.resolve_strategy_name`); it
comes first in `STRATEGY_NAMES`. A record names its builder (a function of
`tfdist.strategy.builders`) instead of holding it, so that the modules the builders use, such
as `tfdist.strategy.compression`, can read the records too.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Mapping, Sequence, Tuple

from tfdist.strategy import communication

__all__ = [
    "ALIASES",
    "AUTO",
    "AUTO_CASES",
    "CLI_CHOICES",
    "COMMUNICATIONS",
    "POOLED",
    "STRATEGIES",
    "STRATEGY_NAMES",
    "WITH_ALL_REDUCE",
    "Strategy",
    "auto_case",
    "canonical_name",
    "known_name",
    "markdown_auto",
    "markdown_nav",
    "markdown_options",
    "markdown_table",
    "quoted",
]


@dataclasses.dataclass(frozen=True)
class Strategy:
    """One strategy tfdist makes.

    Attributes:
        name: the name `make_strategy` and `tfdist launch --strategy` take.
        tensorflow: the TensorFlow class it builds, or the call that returns it (for messages
            and docs).
        build: the name of its builder in `tfdist.strategy.builders` (see that module for the
            builders' keyword arguments).
        summary: what it is for, one line (the table of docs/concepts/strategies.md).
        page: its page, under docs/ (several strategies may share one).
        communications: the `communication=` values it accepts; "auto" first.
        options: TensorFlow's own keyword options (and tfdist's extras) it accepts.
        options_doc: what `options` take, one line (the options table of
            docs/concepts/strategies.md); "" when it takes none.
        aliases: other names for it.
        multi_process: its replicas may be the tasks of a multi-process cluster; False: it
            trains in one process, and is refused where the cluster has several workers.
        uses_ps: its variables live on the cluster's ps tasks: it needs a `ps` job, and a
            strategy without it is refused where the cluster has one.
        one_replica: it trains one replica (nothing to all-reduce).
        all_reduce: its replicas all-reduce their gradients: it takes `gradient_compression=`.
        distributes: False for TensorFlow's default strategy, which distributes nothing: no
            cluster contradicts it, and `make_strategy` applies no fixes for it.
        auto: when "auto" picks it: a key of `AUTO_CASES`, or "" (never).
        serving_tasks: the task types that only serve, in a job with a chief: there
            `make_strategy` starts the task's server and never returns.
        pool: the `tfdist.testing` strategy pool that serves it (`tfdist.testing.pools`), or
            "" when none does.
    """

    name: str
    tensorflow: str
    build: str
    summary: str
    page: str
    communications: Tuple[str, ...] = communication.NONE
    options: Tuple[str, ...] = ()
    options_doc: str = ""
    aliases: Tuple[str, ...] = ()
    multi_process: bool = False
    uses_ps: bool = False
    one_replica: bool = False
    all_reduce: bool = False
    distributes: bool = True
    auto: str = ""
    serving_tasks: Tuple[str, ...] = ()
    pool: str = ""

    @property
    def without_all_reduce(self) -> str:
        """Why it takes no all-reduce choices, for messages; "" when it all-reduces."""
        if self.all_reduce:
            return ""
        if self.uses_ps:
            return "variables live on the ps tasks; there is no all-reduce"
        if self.one_replica:
            return "one replica: nothing to all-reduce"
        return "it has no all-reduce"


# In the order they are documented.
STRATEGIES: Mapping[str, Strategy] = {
    record.name: record
    for record in (
        Strategy(
            "one_device",
            "OneDeviceStrategy",
            "build_one_device",
            "one device (the first of `devices`, else the first local GPU or CPU)",
            "strategies/one-device.md",
            one_replica=True,
            auto="otherwise",
            pool="local",
        ),
        Strategy(
            "mirrored",
            "MirroredStrategy",
            "build_mirrored",
            "one process, several GPUs or logical CPUs; variables copied on each, gradients "
            "all-reduced",
            "strategies/mirrored.md",
            communications=communication.MIRRORED,
            options=("cross_device_ops",),
            options_doc="`cross_device_ops` (a `tf.distribute.CrossDeviceOps`; or use "
            "`communication=`)",
            all_reduce=True,
            auto="devices",
            pool="local",
        ),
        Strategy(
            "multi_worker_mirrored",
            "MultiWorkerMirroredStrategy",
            "build_multi_worker",
            "several processes (possibly on several machines), the same as mirrored across them",
            "strategies/multi-worker-mirrored.md",
            communications=communication.MULTI_WORKER,
            options=(
                "communication_options",
                "bytes_per_pack",
                "timeout_seconds",
                "startup_timeout",
            ),
            options_doc="`communication_options` (a "
            "`tf.distribute.experimental.CommunicationOptions`), or `bytes_per_pack` and "
            "`timeout_seconds`; `startup_timeout`",
            multi_process=True,
            all_reduce=True,
            auto="workers",
            pool="workers",
        ),
        Strategy(
            "parameter_server",
            "ParameterServerStrategy",
            "build_parameter_server",
            "variables on `ps` tasks, workers step asynchronously, the chief coordinates",
            "strategies/parameter-server.md",
            options=(
                "variable_partitioner",
                "min_shard_bytes",
                "max_shard_bytes",
                "max_shards",
                "startup_timeout",
            ),
            options_doc='`variable_partitioner` (a partitioner, or `"min_size"`, '
            '`"max_size"`, `"fixed"`), with `min_shard_bytes` (min_size), `max_shard_bytes` '
            "(max_size) and `max_shards` for the strings; `startup_timeout` (seconds the chief "
            "waits for every worker and ps)",
            multi_process=True,
            uses_ps=True,
            auto="ps_job",
            serving_tasks=("worker", "ps"),
            pool="parameter_server",
        ),
        Strategy(
            "default",
            "tf.distribute.get_strategy()",
            "build_default",
            "no distribution: TensorFlow's default strategy, so `with strategy.scope():` still "
            "works",
            "strategies/one-device.md",
            aliases=("off",),
            one_replica=True,
            distributes=False,
        ),
    )
}

# When "auto" picks a strategy (`Strategy.auto`), in the order "auto" asks (`auto_case`).
AUTO_CASES: Mapping[str, str] = {
    "ps_job": "the cluster has a `ps` job",
    "workers": "more than one task computes gradients (workers, or a chief and workers)",
    "devices": "more than one local GPU, or more than one logical CPU",
    "otherwise": "otherwise",
}

# ------------------------------------------------------------------ derived from STRATEGIES

STRATEGY_NAMES: Tuple[str, ...] = ("auto", *STRATEGIES)
ALIASES: Dict[str, str] = {a: r.name for r in STRATEGIES.values() for a in r.aliases}
COMMUNICATIONS: Dict[str, Tuple[str, ...]] = {r.name: r.communications for r in STRATEGIES.values()}
# Every spelling the CLI's --strategy accepts (and TFDIST_STRATEGY).
CLI_CHOICES: Tuple[str, ...] = STRATEGY_NAMES + tuple(ALIASES)
# The strategies that take gradient_compression=.
WITH_ALL_REDUCE: Tuple[str, ...] = tuple(r.name for r in STRATEGIES.values() if r.all_reduce)
# case of AUTO_CASES -> the strategy "auto" picks then.
AUTO: Dict[str, str] = {r.auto: r.name for r in STRATEGIES.values() if r.auto}
# The strategies a tfdist.testing pool serves: assert_same_training's and `tfdist verify`'s.
POOLED: Tuple[str, ...] = tuple(r.name for r in STRATEGIES.values() if r.pool)


def quoted(names: Sequence[str]) -> str:
    """ "'a'", "'a' and 'b'", "'a', 'b' and 'c'": names for a message."""
    parts = [repr(name) for name in names]
    if len(parts) < 2:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def auto_case(cluster, devices: Sequence[str]) -> str:
    """The case of `AUTO_CASES` that `cluster` (a ClusterSpec) and the local `devices` are in."""
    if cluster.num_ps:
        return "ps_job"
    if not cluster.is_single_process and cluster.num_workers > 1:
        return "workers"
    return "devices" if len(devices) > 1 else "otherwise"


def known_name(key: str) -> str:
    """The strategy (or "auto") that `key` (lower case, "_" for "-") names, aliases folded.

    Raises:
        ValueError: saying which names there are (as TFDIST_STRATEGY's check, which quotes the
            variable).
    """
    key = ALIASES.get(key, key)
    if key not in STRATEGY_NAMES:
        raise ValueError(f"a strategy name: one of {', '.join(CLI_CHOICES)}")
    return key


def canonical_name(name) -> str:
    """The strategy (or "auto") that `name` means: case, "-" and aliases folded.

    Raises:
        TypeError: `name` is not a string.
        ValueError: `name` is not a strategy or an alias.
    """
    if not isinstance(name, str):
        hint = " HINT: YAML reads a bare off/no as False; quote it: 'off'." if name is False else ""
        raise TypeError(
            f"The strategy name must be a string. Received: name={name!r} "
            f"(of type {type(name).__name__}).{hint}"
        )
    key = name.strip().lower().replace("-", "_")
    try:
        return known_name(key)
    except ValueError:
        raise ValueError(
            f"strategy={name!r} is not a known strategy. Choose one of: {', '.join(CLI_CHOICES)}."
        ) from None


def markdown_table() -> str:
    """The table of strategies in docs/concepts/strategies.md, as Markdown (ends in "\\n")."""
    lines = ["| name | TensorFlow class | for |", "| --- | --- | --- |"]
    for record in STRATEGIES.values():
        aliases = ", ".join(f"`{alias}`" for alias in record.aliases)
        name = f"[`{record.name}`](../{record.page})" + (f" (alias {aliases})" if aliases else "")
        lines.append(f"| {name} | `{record.tensorflow}` | {record.summary} |")
    return "\n".join(lines) + "\n"


def markdown_options() -> str:
    """The table of docs/concepts/strategies.md: the options each strategy takes."""
    lines = ["| strategy | options |", "| --- | --- |"]
    without = [f"`{r.name}`" for r in STRATEGIES.values() if not r.options]
    for record in STRATEGIES.values():
        if record.options:
            lines.append(f"| `{record.name}` | {record.options_doc} |")
    if without:
        lines.append(f"| {', '.join(without)} | none |")
    return "\n".join(lines) + "\n"


def markdown_nav() -> list:
    """The "Strategies" section of the docs' navigation: one entry per page, titled by the
    strategies it documents ("one_device and default"), in the order of `STRATEGIES`."""
    pages: Dict[str, list] = {}
    for record in STRATEGIES.values():
        pages.setdefault(record.page, []).append(record.name)
    return [{" and ".join(names): page} for page, names in pages.items()]


def markdown_auto() -> str:
    """The numbered list of docs/concepts/strategies.md: what "auto" picks, in its order."""
    lines = []
    for number, (case, when) in enumerate(AUTO_CASES.items(), 1):
        end = "." if number == len(AUTO_CASES) else ";"
        lines.append(f"{number}. {when}: `{AUTO[case]}`{end}")
    return "\n".join(lines) + "\n"
