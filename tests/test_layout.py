"""The house rules that keep the package readable, checked by reading its source (no imports run):

- imports go one way: base modules (the metric registry among them) -> encodings -> model -> hf -> bench ->
  analysis -> commands; nothing imports commands; hf and bench's rooms (train, eval, run, timing) never import
  the sweep, the loop over cells; evaluation never trains; analysis never trains or evaluates; the model never
  imports the data module;
- no class over 150 lines, no function over 80, none with more than 8 parameters, outside the model's
  numerical kernels (listed below, each with the reason); no module over 450 lines;
- tests mirror the package: every module posenc_bench/<sub>/<name>.py has its tests in tests/<sub>/test_<name>.py;
- no import cycles among the package's modules, counting imports inside functions and under ``if TYPE_CHECKING:``.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "posenc_bench"
MODULE_LINES = 450
# the package and its subpackages, by module name (posenc_bench.model, ...)
PACKAGES = {".".join(p.relative_to(PACKAGE.parent).parent.parts) for p in PACKAGE.rglob("__init__.py")}
# layer of each top-level module or subpackage; a module may import its own layer or lower ones
LAYERS = {"__init__": 0, "errors": 0, "files": 0, "progress": 0, "values": 0, "native": 0, "metrics": 1, "env": 1,
          "tokenizer": 1, "data": 1, "encodings": 2, "model": 3, "hf": 4, "bench": 5, "analysis": 6, "commands": 7, "__main__": 8}
# (importer prefix, imported prefix) pairs that must never occur even where the layers would allow them
FORBIDDEN = [
    ("posenc_bench.hf", "posenc_bench.bench"),
    ("posenc_bench.bench.eval", "posenc_bench.bench.sweep"),  # the rooms never reach back into the loop over cells
    ("posenc_bench.bench.timing", "posenc_bench.bench.sweep"),
    ("posenc_bench.bench.train", "posenc_bench.bench.sweep"),
    ("posenc_bench.bench.run", "posenc_bench.bench.sweep"),
    ("posenc_bench.bench.eval", "posenc_bench.bench.train"),  # evaluation never trains
    ("posenc_bench.analysis", "posenc_bench.bench.sweep"),
    ("posenc_bench.analysis", "posenc_bench.bench.train"),
    ("posenc_bench.analysis", "posenc_bench.bench.eval"),
    ("posenc_bench.model", "posenc_bench.data"),
]
# numerical kernels allowed past the size limits: autograd functions and hot loops whose parameters are the
# tensors of one attention call
KERNELS = {
    "posenc_bench.model.distance_bias._BiasAttention.forward",
    "posenc_bench.model.distance_bias._BiasAttention.backward",
    "posenc_bench.model.distance_bias.band_bias_grad",
    "posenc_bench.model.distance_bias.tiled_backward",
    "posenc_bench.model.distance_bias.bias_attention",
}


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        yield name, ast.parse(path.read_text(), filename=str(path))


def imported(tree, name):
    """Every posenc_bench module a module imports, at the top or inside functions."""
    package = name if name.count(".") == 0 else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("posenc_bench"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base.startswith("posenc_bench"):
                for a in node.names:  # `from posenc_bench import encodings` imports the module encodings
                    yield f"{base}.{a.name}" if base == "posenc_bench" else base


def module_imports(tree, name, known):
    """The package modules (names in ``known``) a module imports, at the top, inside functions or under
    ``if TYPE_CHECKING:``: ``from posenc_bench.model import sinks`` imports posenc_bench.model.sinks,
    ``from posenc_bench.bench.config import RunConfig`` imports posenc_bench.bench.config (its __init__). Not the
    packages above the module named: Python runs them first, but a package that re-exports its modules is no cycle."""
    package = name if name in PACKAGES else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                if f"{base}.{a.name}" in known:
                    yield f"{base}.{a.name}"
                elif base in known:
                    yield base


def import_cycles(graph):
    """Every cycle of ``graph`` (module -> the modules it imports), one per strongly connected component of more
    than one module (or a module importing itself), as the modules of one loop through it."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def connect(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                components.append(set(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [shortest_loop(graph, min(c), c) for c in components]


def shortest_loop(graph, start, within):
    """The shortest path from ``start`` back to itself through the modules ``within``."""
    paths, seen = [[start]], set()
    while paths:
        path = paths.pop(0)
        for w in sorted(graph.get(path[-1], ())):
            if w == start:
                return path + [start]
            if w in within and w not in seen:
                seen.add(w)
                paths.append(path + [w])
    return [start]


def layer(module):
    parts = module.split(".")
    return LAYERS[parts[1]] if len(parts) > 1 else 0


def test_imports_go_one_way():
    bad = []
    for name, tree in modules():
        for target in imported(tree, name):
            if target.split(".")[1] not in LAYERS:
                continue  # a name such as __version__
            if layer(target) > layer(name):
                bad.append(f"{name} imports {target} (a later layer)")
            for src, dst in FORBIDDEN:
                if name.startswith(src) and target.startswith(dst):
                    bad.append(f"{name} imports {target}")
    assert not bad, "\n".join(bad)


# analysis/ reads in one direction: did each model learn -> the statistics -> the runs -> context -> findings ->
# captions -> tables -> plots -> robustness -> gate -> report. A module imports only rooms before it, so one
# `report --findings` call goes down the list and never returns to a room it left.
ANALYSIS_ORDER = ["learned", "stats", "runs", "context", "findings", "captions", "tables", "plots", "robustness",
                  "gate", "report"]


def test_analysis_reads_in_one_direction():
    bad = []
    rank = {room: i for i, room in enumerate(ANALYSIS_ORDER)}
    for name, targets in import_graph().items():
        if not name.startswith("posenc_bench.analysis."):
            continue
        room = name.split(".")[2]
        assert room in rank, f"{name}: add its room to ANALYSIS_ORDER"
        for target in targets:  # ``from posenc_bench.analysis import plots`` counts as importing plots
            if target.startswith("posenc_bench.analysis.") and target.split(".")[2] in rank:
                other = target.split(".")[2]
                if rank[other] > rank[room] or (other == room and room != "stats"):
                    bad.append(f"{name} imports {target} (a later room)")
    assert not bad, "\n".join(bad)


def import_graph():
    trees = dict(modules())
    return {name: set(module_imports(tree, name, trees)) for name, tree in trees.items()}


def test_no_import_cycles():
    """No module imports itself through others, not even for type hints or inside a function: each idea
    reads from the modules below it (a cycle ties two modules into one that neither file shows)."""
    cycles = import_cycles(import_graph())
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_nothing_imports_commands():
    bad = [f"{name} imports {t}" for name, tree in modules() if not name.startswith(("posenc_bench.commands", "posenc_bench.__main__"))
           for t in imported(tree, name) if t.startswith("posenc_bench.commands")]
    assert not bad


def sizes():
    for name, tree in modules():
        def visit(node, prefix):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    qual = f"{prefix}.{child.name}"
                    lines = child.end_lineno - child.lineno + 1
                    params = None
                    if not isinstance(child, ast.ClassDef):
                        a = child.args
                        params = len([p for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls", "ctx")])
                    yield qual, child, lines, params
                    yield from visit(child, qual)
        yield from visit(tree, name)


def test_units_stay_small():
    bad = []
    for qual, node, lines, params in sizes():
        if qual in KERNELS:
            continue
        if isinstance(node, ast.ClassDef) and lines > 150:
            bad.append(f"class {qual}: {lines} lines > 150")
        elif not isinstance(node, ast.ClassDef) and lines > 80:
            bad.append(f"function {qual}: {lines} lines > 80")
        if params is not None and params > 8:
            bad.append(f"function {qual}: {params} parameters > 8")
    assert not bad, "\n".join(bad)


def test_the_checks_can_fail(tmp_path):
    """The readers above see what they must: a function-local import, a relative import and a long function."""
    tree = ast.parse("def f():\n    from posenc_bench.commands import cli\n    from ..bench import sweep\n")
    found = set(imported(tree, "posenc_bench.model.transformer"))
    assert {"posenc_bench.commands", "posenc_bench.bench"} <= found
    assert layer("posenc_bench.commands.cli") > layer("posenc_bench.model.transformer")
    with pytest.raises(KeyError):
        layer("posenc_bench.nosuch.thing")
    # a cycle closed by an import for type hints only, and one closed inside a function
    known = {"posenc_bench.model.a", "posenc_bench.model.b", "posenc_bench.model.c", "posenc_bench.model"}
    a = ast.parse("from posenc_bench.model import b\nfrom . import c\n")
    b = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from posenc_bench.model.a import A\n")
    c = ast.parse("def f():\n    import posenc_bench.model.a\n")
    assert set(module_imports(a, "posenc_bench.model.a", known)) == {"posenc_bench.model.b", "posenc_bench.model.c"}
    graph = {name: set(module_imports(tree, name, known)) for name, tree in
             (("posenc_bench.model.a", a), ("posenc_bench.model.b", b), ("posenc_bench.model.c", c))}
    assert import_cycles(graph) == [["posenc_bench.model.a", "posenc_bench.model.b", "posenc_bench.model.a"]]
    assert shortest_loop(graph, "posenc_bench.model.c", set(graph)) == [
        "posenc_bench.model.c", "posenc_bench.model.a", "posenc_bench.model.c"]
    assert import_cycles({"x": {"y"}, "y": set()}) == []


def test_no_module_is_over_450_lines():
    long = [f"{p.relative_to(PACKAGE)}: {n} lines" for p in sorted(PACKAGE.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MODULE_LINES]
    assert not long, "\n".join(long)


def test_every_module_has_its_test_file():
    """posenc_bench/bench/rows.py -> tests/bench/test_rows.py; posenc_bench/data.py -> tests/test_data.py. The
    package's __init__ modules (re-exports, the version) and __main__ (the entry point) have nothing of their own."""
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.name in ("__init__.py", "__main__.py"):
            continue
        test = ROOT / "tests" / rel.parent / f"test_{rel.stem}.py"
        if not test.is_file():
            missing.append(f"{rel} has no {test.relative_to(ROOT)}")
    assert not missing, "\n".join(missing)
