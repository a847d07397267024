"""The strategies tfdist makes, one record each: the single source of every strategy name.

`make_strategy`, the CLI's `--strategy` choices, the `communication=` vocabulary, the options
each strategy accepts and the aliases all derive from `STRATEGIES`. "auto" is not a strategy
but a decision (`tfdist.strategy.factory.resolve_strategy_name`); it comes first in
`STRATEGY_NAMES`. Imports the builders (and nothing that imports this module).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Mapping, Tuple

from tfdist.strategy import communication
from tfdist.strategy.builders import (
    build_default,
    build_mirrored,
    build_one_device,
    build_parameter_server,
)
from tfdist.strategy.multi_worker import build_multi_worker

__all__ = [
    "ALIASES",
    "CLI_CHOICES",
    "COMMUNICATIONS",
    "STRATEGIES",
    "STRATEGY_NAMES",
    "Strategy",
    "canonical_name",
]


@dataclasses.dataclass(frozen=True)
class Strategy:
    """One strategy tfdist makes.

    Attributes:
        name: the name `make_strategy` and `tfdist launch --strategy` take.
        tensorflow: the TensorFlow class it builds (for messages and docs).
        build: the builder (see tfdist.strategy.builders for its keyword arguments).
        communications: the `communication=` values it accepts; "auto" first.
        options: TensorFlow's own keyword options (and tfdist's extras) it accepts.
        aliases: other names for it.
    """

    name: str
    tensorflow: str
    build: Callable
    communications: Tuple[str, ...] = communication.NONE
    options: Tuple[str, ...] = ()
    aliases: Tuple[str, ...] = ()


# In the order they are documented.
STRATEGIES: Mapping[str, Strategy] = {
    record.name: record
    for record in (
        Strategy("one_device", "OneDeviceStrategy", build_one_device),
        Strategy(
            "mirrored",
            "MirroredStrategy",
            build_mirrored,
            communications=communication.MIRRORED,
            options=("cross_device_ops",),
        ),
        Strategy(
            "multi_worker_mirrored",
            "MultiWorkerMirroredStrategy",
            build_multi_worker,
            communications=communication.MULTI_WORKER,
            options=(
                "communication_options",
                "bytes_per_pack",
                "timeout_seconds",
                "startup_timeout",
            ),
        ),
        Strategy(
            "parameter_server",
            "ParameterServerStrategy",
            build_parameter_server,
            options=(
                "variable_partitioner",
                "min_shard_bytes",
                "max_shard_bytes",
                "max_shards",
                "startup_timeout",
            ),
        ),
        Strategy("default", "the default strategy", build_default, aliases=("off",)),
    )
}

STRATEGY_NAMES: Tuple[str, ...] = ("auto", *STRATEGIES)
ALIASES: Dict[str, str] = {a: r.name for r in STRATEGIES.values() for a in r.aliases}
COMMUNICATIONS: Dict[str, Tuple[str, ...]] = {r.name: r.communications for r in STRATEGIES.values()}
# Every spelling the CLI's --strategy accepts.
CLI_CHOICES: Tuple[str, ...] = STRATEGY_NAMES + tuple(ALIASES)


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
    key = ALIASES.get(key, key)
    if key not in STRATEGY_NAMES:
        raise ValueError(
            f"strategy={name!r} is not a known strategy. Choose one of: {', '.join(CLI_CHOICES)}."
        )
    return key
