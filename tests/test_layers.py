"""rotviz is built in layers: no import cycle, counting imports inside functions too (an ast
walk over the package, the app's pages and the benchmarks), and no module imports a layer
above its own. The app (rotviz.ui: its launcher, helpers and pages) sits above the rest of the
library and the benchmarks (bench/) above it: nothing else in rotviz imports either."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "rotviz"
ROOTS = (PKG, REPO / "bench")


def modules(*roots: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every package or folder of scripts in `roots`."""
    out = {}
    for root in roots or ROOTS:
        for p in root.rglob("*.py"):
            if "__pycache__" in p.parts:
                continue
            parts = p.relative_to(root.parent).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = p
    return out


def imports(path: Path, known: set[str]) -> set[str]:
    """The rotviz modules a file imports, at any depth of its code."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in known else node.module)
    return out & known


def graph(*roots: Path) -> dict[str, set[str]]:
    mods = modules(*roots)
    return {m: imports(p, set(mods)) - {m} for m, p in mods.items()}


@functools.cache
def whole_graph() -> dict[str, set[str]]:
    """The graph of every root, parsed once per process: the files do not change in a run."""
    return graph()


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(g.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycle():
    cycle = find_cycle(whole_graph())
    assert cycle is None, " -> ".join(cycle)


def test_the_check_finds_a_planted_cycle(tmp_path):
    pkg = tmp_path / "rotviz"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("def f():\n    from rotviz.b import g\n")  # in a function
    (pkg / "b.py").write_text("from rotviz.a import x\n")
    assert find_cycle(graph(pkg)) == ["rotviz.a.x", "rotviz.b", "rotviz.a.x"]
    (pkg / "a" / "x.py").write_text("def f():\n    pass\n")
    assert find_cycle(graph(pkg)) is None


# Layers, lowest first: a module may import its own layer and those below it.
LAYERS = [
    ("core", ["rotviz.errors", "rotviz.limits", "rotviz.params", "rotviz.records",
              "rotviz.version", "rotviz.types", "rotviz.outputs", "rotviz.dist", "rotviz.memory",
              "rotviz.confine", "rotviz.devices", "rotviz.user_cache",
              # results kept while tensors live: matching's, and the residual solver's below it
              "rotviz.match.memo"]),
    ("arch", ["rotviz.arch"]),
    ("groups", ["rotviz.groups"]),
    ("symmetry", ["rotviz.symmetry"]),
    ("models", ["rotviz.data", "rotviz.heads", "rotviz.sources", "rotviz.evaluation",
                "rotviz.random_models", "rotviz.zoo_registry",
                # at size: the runtime, blocks, the need and points, beside the loaders
                "rotviz.atsize"]),
    # the straight path's points (path_point) and their evaluation into a curve: below
    # matching, which learns along such paths (rotviz.match.learned)
    ("paths", ["rotviz.analysis.paths"]),
    ("match", ["rotviz.match"]),
    ("merging", ["rotviz.merging"]),
    ("analysis", ["rotviz.analysis"]),
    # at size, what is built on matching and the analyses (the slice's: its grid and
    # directions)
    ("atsize", ["rotviz.atsize.endpoints", "rotviz.atsize.landscape", "rotviz.atsize.merge",
                "rotviz.atsize.slice"]),
    ("plots", ["rotviz.plots"]),
    ("measures", ["rotviz.measures"]),
    ("runner", ["rotviz.runner"]),
    # rotviz.ui.options: the app's streamlit settings as plain data (no streamlit), which
    # `rotviz serve` (rotviz.cli) passes as flags
    ("top", ["rotviz.zoo", "rotviz.app", "rotviz.gallery", "rotviz.cli", "rotviz",
             "rotviz.ui.options"]),
    # the Streamlit app: the launcher, the helpers and the pages (rotviz/ui/views/)
    ("pages", ["rotviz.ui"]),
    ("bench", ["bench"]),
]


def layer_of(module: str) -> int:
    best, rank = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    return rank


@pytest.mark.parametrize("module", sorted(modules()))
def test_no_module_imports_a_layer_above_its_own(module):
    g = whole_graph()
    mine = layer_of(module)
    assert mine >= 0, f"{module} is in no layer: add it to LAYERS"
    above = sorted(n for n in g[module] if layer_of(n) > mine)
    assert not above, f"{module} ({LAYERS[mine][0]}) imports {above} from a layer above"


def test_the_pages_draw_figures_through_records_and_rotviz_app():
    """No module of rotviz/ui/ (helpers and pages) imports rotviz.plots: a page draws a record's
    figure through the record (its `plot` or its section's `figures`, in the page's Style) and
    any other through rotviz.app.figures; only the Style itself (rotviz.plots.figure_style, free
    of plotly) is the pages' to build."""
    pages = {m: p for m, p in modules().items() if m == "rotviz.ui" or m.startswith("rotviz.ui.")}
    assert "rotviz.ui.views.barrier" in pages and "rotviz.ui.section" in pages
    known = set(modules())
    found = {m: sorted(i for i in imports(p, known) if i.startswith("rotviz.plots")
                       and i != "rotviz.plots.figure_style")
             for m, p in pages.items()}
    assert not {m: i for m, i in found.items() if i}, found


def test_the_public_api_is_importable_from_rotviz_itself():
    """The names the README's library example uses, each the function or class itself (no
    submodule of the same name shadows one once it is imported)."""
    import rotviz
    import rotviz.evaluation  # noqa: F401  (a submodule import must not shadow evaluate)
    from rotviz import (
        MatchOptions,
        evaluate,
        interpolate,
        load_model,
        loss_plane,
        match_models,
        merge,
    )

    for obj in (evaluate, interpolate, load_model, loss_plane, match_models, merge):
        assert callable(obj) and obj.__name__ in rotviz.__all__
    assert MatchOptions().label == "ffn,attn,rescale"
    assert not set(rotviz.__all__) & {m.split(".")[1] for m in modules(PKG) if m.count(".") >= 1}
