"""A dataset's serialized graph, read for the shard decision: the files it reads, and whether
it shuffles without a seed.

    graph = serialized_graph(dataset)
    reads(graph)             # ("files", 8), ("files", None) or ("memory", "RangeDataset")
    unseeded_shuffle(graph)  # True: workers sharding by DATA would keep overlapping examples

The file count is read from constant file names (a list of paths given to a reader, directly
or through `from_tensor_slices(files).interleave(...)`); names computed at run time count as
unknown.

TensorFlow is imported inside the functions only.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

__all__ = ["PASS_THROUGH", "READER_PREFIXES", "reads", "serialized_graph", "unseeded_shuffle"]

# Source datasets that read files, as tf.data's own auto-shard rewrite recognises them.
READER_PREFIXES = (
    "TFRecordDataset",
    "TextLineDataset",
    "FixedLengthRecordDataset",
    "ArrayRecordDataset",
    "RecordIODataset",
    "SSTableDataset",
    "CSVDataset",
    "ExperimentalCSVDataset",
    "LMDBDataset",
    "ExperimentalLMDBDataset",
)
# Datasets that pass the elements of their first input through (count and identity).
PASS_THROUGH = (
    "ShuffleDataset",
    "ShuffleDatasetV2",
    "ShuffleDatasetV3",
    "ShuffleAndRepeatDataset",
    "ShuffleAndRepeatDatasetV2",
    "PrefetchDataset",
    "CacheDataset",
    "CacheDatasetV2",
    "RepeatDataset",
    "OptionsDataset",
    "ModelDataset",
    "MaxIntraOpParallelismDataset",
    "PrivateThreadPoolDataset",
    "AssertCardinalityDataset",
    "AssertNextDataset",
    "FinalizeDataset",
)


def serialized_graph(dataset):
    """The dataset's GraphDef (external state, e.g. a Python generator, only warned about)."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    graph.ParseFromString(
        dataset._as_serialized_graph(  # pylint: disable=protected-access
            external_state_policy=tf.data.experimental.ExternalStatePolicy.WARN
        ).numpy()
    )
    return graph


def _functions_with_readers(graph) -> set:
    """Names of library functions that (directly or through nested functions) read files."""
    calls, direct = {}, set()
    for function in graph.library.function:
        name = function.signature.name
        calls[name] = set()
        for node in function.node_def:
            if node.op.startswith(READER_PREFIXES):
                direct.add(name)
            for value in node.attr.values():
                if value.func.name:
                    calls[name].add(value.func.name)
                calls[name].update(f.name for f in value.list.func)
    found, changed = set(direct), True
    while changed:
        changed = False
        for name, callees in calls.items():
            if name not in found and callees & found:
                found.add(name)
                changed = True
    return found


def _shape(const) -> list:
    """The dimensions of a Const node's value (without decoding it)."""
    return [int(d.size) for d in const.attr["value"].tensor.tensor_shape.dim]


class _Walk:
    """One walk from the dataset's output towards its sources."""

    def __init__(self, graph):
        self.nodes = {n.name: n for n in graph.node}
        self.readers = _functions_with_readers(graph)
        self.seen: set = set()

    def node_of(self, name: str):
        return self.nodes.get(name.lstrip("^").split(":")[0])

    def through(self, node, ops):
        """The first node from `node` down its first inputs whose op is not in `ops`."""
        while node is not None and node.op in ops:
            node = self.node_of(node.input[0])
        return node

    def count_elements(self, node) -> Optional[int]:
        """How many elements (file names) a small file-name dataset has, or None."""
        node = self.through(node, PASS_THROUGH)
        if node is None or node.op not in ("TensorSliceDataset", "TensorDataset"):
            return None
        const = self.through(self.node_of(node.input[0]), ("Identity",))
        if const is None or const.op != "Const":
            return None
        dims = _shape(const)
        if node.op == "TensorDataset":
            return math.prod(dims)
        return dims[0] if dims else None

    def reader(self, node) -> Tuple[str, Optional[int]]:
        """A reader dataset: its constant file names counted, else unknown."""
        files = self.through(self.node_of(node.input[0]), ("Identity",))
        if files is not None and files.op == "Const":
            return ("files", math.prod(_shape(files)))
        return ("files", None)

    def visit(self, node) -> Tuple[str, object]:
        if node is None or node.name in self.seen:
            return ("memory", "unknown")
        self.seen.add(node.name)
        if node.op.startswith(READER_PREFIXES):
            return self.reader(node)
        functions = {v.func.name for v in node.attr.values() if v.func.name}
        if functions & self.readers:  # e.g. interleave(TFRecordDataset) over file names
            return ("files", self.count_elements(self.node_of(node.input[0])))
        inputs = [self.node_of(i) for i in node.input if not i.startswith("^")]
        datasets = [n for n in inputs if n is not None and "Dataset" in n.op]
        if not datasets:
            return ("memory", node.op)
        return _combined([self.visit(d) for d in datasets])


def _combined(results: list) -> Tuple[str, object]:
    """Several inputs (zip, concatenate): files only when every input reads counted files."""
    files = [r for r in results if r[0] == "files"]
    if not files:
        return results[0]
    if len(files) != len(results) or any(r[1] is None for r in files):
        return ("files", None)
    return ("files", min(r[1] for r in files))


def reads(graph) -> Tuple[str, object]:
    """What the dataset reads: ("files", count), ("files", None) or ("memory", source op)."""
    output = next((n for n in graph.node if n.op == "_Retval"), None)
    if output is None:
        return ("memory", "unknown")
    walk = _Walk(graph)
    return walk.visit(walk.node_of(output.input[0]))


def unseeded_shuffle(graph) -> bool:
    """Whether the dataset shuffles with seeds that are both constant 0 (a fresh random order
    in every process)."""
    from tensorflow.python.framework import tensor_util

    nodes = {n.name: n for n in graph.node}
    for node in graph.node:
        if node.op.startswith("Shuffle") and len(node.input) >= 4:
            seeds = [nodes.get(i.split(":")[0]) for i in node.input[2:4]]
            if all(s is not None and s.op == "Const" for s in seeds) and not any(
                int(tensor_util.MakeNdarray(s.attr["value"].tensor)) for s in seeds
            ):
                return True
    return False
