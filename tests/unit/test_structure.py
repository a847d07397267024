"""The package's structure: no import cycles, each room importing only the rooms the data flow
puts below it, and no private name imported from another module.

The graph counts every import, at module level and inside functions: a lazy import that closes
a cycle is still a cycle in the design, only one that Python tolerates.

A room is a top-level module of tfdist or a top-level package with everything in it
(tfdist.strategy.factory is in the room tfdist.strategy), so a module that becomes a package of
the same name stays in its room.
"""

import ast

from helpers.paths import ROOT


def _modules() -> dict:
    found = {}
    for path in (ROOT / "tfdist").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, source: str, is_package: bool = False) -> list:
    """(module, [names] or None) for each import statement of module `name`, anywhere in it:
    `import a.b` gives ("a.b", None), `from a import b, c` gives ("a", ["b", "c"]), and a
    relative import is made absolute."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                package = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                module = ".".join(part for part in (package, module) if part)
            found.append((module, [alias.name for alias in node.names]))
    return found


def import_graph() -> dict:
    """module -> the tfdist modules it imports (`from pkg import mod` counts as pkg.mod)."""
    modules = _modules()

    def resolve(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for module, names in imports(name, path.read_text(), path.name == "__init__.py"):
            targets = [module]
            if names is not None:
                targets = [f"{module}.{n}" if f"{module}.{n}" in modules else module for n in names]
            for target in targets:
                target = resolve(target) if target.split(".")[0] == "tfdist" else ""
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict) -> list:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_leaves_import_no_other_tfdist_module():
    graph = import_graph()
    for leaf in ("tfdist.releases", "tfdist.settings", "tfdist.fixes.record"):
        allowed = {"tfdist.releases"} if leaf == "tfdist.fixes.record" else set()
        assert graph[leaf] <= allowed, (leaf, graph[leaf])


def room(name: str) -> str:
    """The room of module `name`: tfdist.strategy.factory -> tfdist.strategy, tfdist -> tfdist."""
    return ".".join(name.split(".")[:2])


def package_graph(graph: dict) -> dict:
    """The same graph with each module folded into its room (tfdist.strategy.factory ->
    tfdist.strategy): the rooms a newcomer sees."""
    folded = {room(name): set() for name in graph}
    for name, targets in graph.items():
        folded[room(name)] |= {room(t) for t in targets if room(t) != room(name)}
    return folded


def test_the_packages_import_each_other_one_way():
    """No two packages (or top-level modules) import each other, even through different
    modules: tfdist.strategy importing tfdist.launcher while the launcher imports the strategy
    would make them one concept in two places."""
    graph = import_graph()
    del graph["tfdist"]  # the package's own __init__ re-exports every part
    for targets in graph.values():
        targets.discard("tfdist")
    assert cycles(package_graph(graph)) == []


# ------------------------------------------------------------------------------ the layers
# Which rooms each room may import: DESIGN.md's data flow, bottom to top. BASE, CLUSTER, ...
# are the rooms of one step of the flow together with those of every step under it; a room may
# import the rooms of the steps below its own (and, where its row says so, some of its own
# step). A new top-level module or package needs a row here, and its name in its step.


def _rooms(*names: str) -> frozenset:
    return frozenset(f"tfdist.{name}" for name in names)


BASE = _rooms("errors", "flavour", "gpus", "netns", "releases", "scratch", "settings", "signals")
CLUSTER = BASE | _rooms("cluster", "task")
STRATEGY = CLUSTER | _rooms("fit_agreement", "fixes", "profiler", "strategy", "training_report")
DATA = STRATEGY | _rooms("data", "learning_rate", "precision")
TRAINING = DATA | _rooms("parameter_server", "training")
FAULTS = TRAINING | _rooms("preemption")
LAUNCHER = FAULTS | _rooms("launcher")
WAYS_IN = LAUNCHER | _rooms("horovod", "keras_distribution")

LAYERS = {
    # The base, which every room above may import: the environment variables (settings), the
    # releases and the Keras in use, errors, signals, network namespaces, the host's GPUs, a
    # task's scratch directory.
    "tfdist.errors": _rooms(),
    "tfdist.gpus": _rooms("settings"),
    "tfdist.netns": _rooms(),
    "tfdist.releases": _rooms(),
    "tfdist.scratch": _rooms("settings"),
    "tfdist.settings": _rooms(),
    "tfdist.signals": _rooms(),
    "tfdist.flavour": _rooms("releases", "settings"),
    # environment -> ClusterSpec: who is in the job, who am I
    "tfdist.cluster": BASE,
    "tfdist.task": BASE | _rooms("cluster"),
    # -> strategy, with the fixes it applies and the training report it installs
    "tfdist.fit_agreement": CLUSTER,
    # (a fix of the variables' broadcast asks the workers' agreement before each one)
    "tfdist.fixes": CLUSTER | _rooms("fit_agreement"),
    "tfdist.training_report": BASE,
    # (under parameter_server the chief's trace asks the job's servers to trace: the task)
    "tfdist.profiler": CLUSTER,
    "tfdist.strategy": CLUSTER | _rooms("fit_agreement", "fixes", "profiler", "training_report"),
    # -> precision policy, data
    "tfdist.precision": STRATEGY,
    "tfdist.data": STRATEGY,
    "tfdist.learning_rate": BASE,
    # -> training: tfdist.fit, and the parameter-server trainer it hands off to
    "tfdist.parameter_server": DATA,
    "tfdist.training": DATA | _rooms("parameter_server"),
    # faults: BackupAndRestore is a Keras callback over training (the parameter-server loop
    # drives it through a duck-typed protocol, never an import)
    "tfdist.preemption": TRAINING,
    # the launcher starts the processes that run all of this, and reads preemption's exit code
    "tfdist.launcher": FAULTS,
    # ways in over the same machinery
    "tfdist.horovod": LAUNCHER,
    "tfdist.keras_distribution": LAUNCHER,
    # the package's facade (`import tfdist`), which re-exports the public names
    "tfdist": WAYS_IN,
    # on top: the test helpers (they start jobs, and strategies through the facade), then the
    # CLI, whose commands reach every part (horovodrun, doctor), and `python -m tfdist`
    "tfdist.testing": WAYS_IN | {"tfdist"},
    "tfdist.cli": WAYS_IN | {"tfdist", "tfdist.testing"},
    "tfdist.__main__": _rooms("cli"),
}

# Single imports against the flow, each with its reason: (module, the room it imports).
CROSSINGS = {
    ("tfdist.fixes.parameter_server", "tfdist.parameter_server"): (
        "the fix that gives Keras 3's model.fit parameter-server training hands each fit to "
        "tfdist's trainer (imported when fit is called)"
    ),
    ("tfdist.fixes.tf_keras_parameter_server", "tfdist.parameter_server"): (
        "the fix that applies each step of tf_keras' parameter-server fit once schedules its "
        "steps through tfdist's exactly-once runner (imported when a train function is made)"
    ),
    ("tfdist.launcher.startup.sitecustomize", "tfdist"): (
        "every task of a job starts as if its script began with `import tfdist` (the Keras hook)"
    ),
    ("tfdist.launcher.startup.sitecustomize", "tfdist.horovod"): (
        "the start-up installs the Horovod shim in the tasks of `tfdist horovodrun`"
    ),
    ("tfdist.launcher.smoke_job", "tfdist"): (
        "the doctor's job script uses the public API as a user's script does"
    ),
}


def forbidden_imports(graph: dict, layers: dict, crossings=()) -> list:
    """One message for each import in `graph` of a room that the importer's room may not
    import (`layers`: room -> the rooms it may import), save the `crossings`, and for each
    module whose room has no row."""
    found = []
    for name in sorted(graph):
        here = room(name)
        if here not in layers:
            found.append(
                f"{name}: its room {here} has no row in LAYERS. HINT: add one, and add {here} "
                "to its step of the data flow (DESIGN.md)."
            )
            continue
        for target in sorted(graph[name]):
            there = room(target)
            if there == here or there in layers[here] or (name, there) in crossings:
                continue
            allowed = ", ".join(sorted(layers[here])) or "no other room"
            found.append(
                f"{name} imports {target}, but the room {here} may import only {allowed} "
                f"(LAYERS[{here!r}]). HINT: move what needs {there} to a room that may import "
                "it, or have a room above both hand it in; if the data flow itself changed, "
                "change LAYERS (and DESIGN.md) on purpose."
            )
    return found


def test_each_room_imports_only_the_rooms_below_it():
    found = forbidden_imports(import_graph(), LAYERS, CROSSINGS)
    assert not found, "\n" + "\n".join(found)


def test_the_layers_flow_one_way_over_the_rooms_there_are():
    rooms = {room(name) for name in import_graph()}
    assert sorted(set(LAYERS) - rooms) == [], "rows of LAYERS for rooms that no longer exist"
    named = set().union(*LAYERS.values())
    assert sorted(named - set(LAYERS)) == [], "rooms in LAYERS' steps without a row"
    assert cycles(LAYERS) == [], "rooms that LAYERS lets import each other"


def test_each_crossing_is_still_made():
    graph = import_graph()
    gone = [(n, r) for n, r in CROSSINGS if r not in {room(t) for t in graph.get(n, ())}]
    assert gone == [], "CROSSINGS no longer made: delete them"


def test_the_layer_check_finds_a_forbidden_import():
    layers = {"tfdist.cluster": _rooms(), "tfdist.strategy": _rooms("cluster")}
    graph = {
        "tfdist.cluster.spec": {"tfdist.cluster", "tfdist.strategy.factory"},
        "tfdist.cluster": set(),
        "tfdist.strategy.factory": {"tfdist.cluster.spec"},
        "tfdist.horovod": set(),
    }
    found = forbidden_imports(graph, layers)
    assert len(found) == 2
    assert found[0].startswith(
        "tfdist.cluster.spec imports tfdist.strategy.factory, but the room tfdist.cluster may "
        "import only no other room (LAYERS['tfdist.cluster'])."
    )
    assert found[1].startswith("tfdist.horovod: its room tfdist.horovod has no row in LAYERS.")
    crossing = {("tfdist.cluster.spec", "tfdist.strategy"): "why"}
    assert forbidden_imports(graph, {**layers, "tfdist.horovod": _rooms()}, crossing) == []


# ------------------------------------------------------------------------- private names


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_names_imported(name: str, source: str, is_package: bool = False) -> list:
    """(module, private name) for each private name that module `name` imports from tfdist:
    `from tfdist.x import _y`, or a private module on the way (`tfdist.x._m`)."""
    found = []
    for module, names in imports(name, source, is_package):
        if module.split(".")[0] != "tfdist":
            continue
        found.extend((module, part) for part in module.split(".") if _private(part))
        found.extend((module, n) for n in names or () if _private(n))
    return found


def test_no_module_imports_a_private_name_of_another():
    """A leading underscore says "this module's own": a name that another module needs is
    public where it is defined, so `from tfdist.x import _y` is refused, at module level and
    inside functions alike. A private alias is not a private name: `from tfdist import
    training_report as _report` and `from tfdist.cluster import free_ports as _free_ports`
    import public names under a name this module keeps to itself. Dunders (`__version__`) are
    not private. Reading a private attribute of an imported module (`module._y`) is no import
    and not checked here; tests, which test private helpers, are not checked either."""
    found = set()
    for name, path in _modules().items():
        for module, private in private_names_imported(
            name, path.read_text(), path.name == "__init__.py"
        ):
            found.add((name, module, private))
    refused = [
        f"{name} imports the private name {private} from {module}. HINT: make it public where "
        "it is defined (no leading underscore), or keep the code that needs it there."
        for name, module, private in sorted(found)
    ]
    assert not refused, "\n" + "\n".join(refused)


def test_the_private_name_check_finds_private_names():
    source = (
        "import os\n"
        "from os import _exit\n"
        "from tfdist import __version__, training_report as _report\n"
        "from tfdist.cluster import free_ports as _free_ports, _parse\n"
        "import tfdist.launcher._hidden as hidden\n"
        "def f():\n"
        "    from ._local import public\n"
        "    from .spec import _reader\n"
    )
    assert private_names_imported("tfdist.cluster.slurm", source) == [
        ("tfdist.cluster", "_parse"),
        ("tfdist.launcher._hidden", "_hidden"),
        ("tfdist.cluster._local", "_local"),
        ("tfdist.cluster.spec", "_reader"),
    ]


def test_no_two_test_files_share_a_name():
    """pytest imports test files by their names (conftest.py: no __init__.py in the tiers)."""
    names = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}
