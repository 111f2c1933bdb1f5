"""Dependencies point one way: no circle of imports between the modules of ``ebpo_verl/``, nor
between their sub-packages. Every import statement counts, at module level or inside a function (a lazy import
is still a dependency), read from the source with :mod:`ast`, nothing imported."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ebpo_verl",)


def modules(root: Path | None = None) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of the packages (a package is its ``__init__``)."""
    root, out = root or ROOT, {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imported(path: Path, name: str, known: Mapping[str, Path]) -> set[str]:
    """The first-party modules ``path`` (module ``name``) imports: ``from a.b import c`` is ``a.b.c`` when that
    is a module, else ``a.b``; relative imports are resolved against the module's package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # ``import a.b.c`` of a missing module: its nearest package
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def unit(module: str) -> str:
    """The sub-package a module belongs to: ``ebpo_verl.<sub>`` for ``ebpo_verl/<sub>/...``; a top-level module
    of ``ebpo_verl`` is its own unit."""
    parts = module.split(".")
    is_package = (ROOT / Path(*parts[:2])).is_dir()
    return ".".join(parts[:2]) if len(parts) > 1 and is_package else module


def circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (each a circle), sorted (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(out)


def check(found: list[list[str]], what: str) -> None:
    assert not found, f"import circles between {what}: " + "; ".join(" <-> ".join(c) for c in found)


def graphs() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> modules it imports, sub-package -> sub-packages it imports)."""
    known = modules()
    by_module = {name: imported(path, name, known) for name, path in known.items()}
    by_unit: dict[str, set[str]] = {}
    for name, targets in by_module.items():
        by_unit.setdefault(unit(name), set()).update(unit(t) for t in targets if unit(t) != unit(name))
    return by_module, by_unit


def test_the_circle_finder_on_known_graphs():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set(), "c": {"d"}, "d": {"c", "a"}}) == [["c", "d"]]
    assert circles({"a": {"b"}, "b": {"c"}}) == []


def test_imports_are_read_from_every_place(tmp_path):
    (tmp_path / "ebpo_verl" / "sub").mkdir(parents=True)
    for name in ("__init__", "x", "y", "sub/__init__", "sub/z"):
        (tmp_path / "ebpo_verl" / f"{name}.py").write_text("")
    source = "import os\nfrom . import y\ndef f():\n    from .sub import z\n    import ebpo_verl.sub.missing\n"
    (tmp_path / "ebpo_verl" / "x.py").write_text(source)
    known = modules(tmp_path)
    assert imported(tmp_path / "ebpo_verl" / "x.py", "ebpo_verl.x", known) == {
        "ebpo_verl.y", "ebpo_verl.sub.z", "ebpo_verl.sub"
    }  # fmt: skip


def test_no_circle_between_modules():
    by_module, _ = graphs()
    assert len(by_module) > 50 and by_module["ebpo_verl.evaluate.prompts"] >= {"ebpo_verl.data.schema"}  # it reads
    check(circles(by_module), "modules")


def test_no_circle_between_sub_packages():
    _, by_unit = graphs()
    assert {"ebpo_verl.evaluate", "ebpo_verl.recipes", "ebpo_verl.study", "ebpo_verl.data"} <= set(by_unit)
    check(circles(by_unit), "sub-packages")


# The layers from the bottom up (ebpo_verl/<unit>): a unit may import only the units of its own layer or below.
# The applications (recipes, evaluate, study, smoke) and the entry points sit above all of these.
LAYERS = (
    {"ebpo_verl.options", "ebpo_verl.ops", "ebpo_verl.version", "ebpo_verl.compat"},
    {"ebpo_verl.algos"},
    {"ebpo_verl.reward", "ebpo_verl.paper_reward", "ebpo_verl.data"},  # the rewards and the data sets' schemas
    {"ebpo_verl.trainer", "ebpo_verl.cpu"},
)
# Outside packages the math may not import: it is torch and numpy only.
MATH_UNITS = ("ebpo_verl.options", "ebpo_verl.algos")
NOT_IN_MATH = ("verl", "ray", "vllm", "hydra", "omegaconf", "transformers")


def layer(unit_name: str) -> int:
    """The layer of a unit: its index in :data:`LAYERS`, or one above them all (an application)."""
    return next((i for i, units in enumerate(LAYERS) if unit_name in units), len(LAYERS))


def test_every_import_points_down_the_layers():
    _, by_unit = graphs()
    assert by_unit["ebpo_verl.trainer"] >= {"ebpo_verl.algos", "ebpo_verl.ops"}  # the check sees arrows
    upward = [f"{u} -> {t}" for u, targets in sorted(by_unit.items()) for t in sorted(targets) if layer(t) > layer(u)]
    assert not upward, "imports pointing up the layers: " + "; ".join(upward)


def third_party(path: Path) -> set[str]:
    """The top-level names of the outside packages ``path`` imports (every import statement, lazy ones too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out - {"ebpo_verl"}


def test_the_math_imports_no_verl_and_nothing_above_it():
    known = modules()
    math_modules = {n: p for n, p in known.items() if unit(n) in MATH_UNITS}
    math_of_ebpo = "ebpo_verl.algos.ebpo_math"
    assert math_of_ebpo in math_modules and "torch" in third_party(math_modules[math_of_ebpo])
    bad = {n: sorted(third_party(p) & set(NOT_IN_MATH)) for n, p in math_modules.items()}
    assert not any(bad.values()), f"the math imports verl-side packages: { {n: b for n, b in bad.items() if b} }"
    above = {n: sorted(t for t in imported(p, n, known) if unit(t) not in MATH_UNITS) for n, p in math_modules.items()}
    assert not any(above.values()), f"the math imports the layers above it: { {n: a for n, a in above.items() if a} }"


def test_the_layer_check_sees_an_upward_import():
    assert layer("ebpo_verl.algos") < layer("ebpo_verl.trainer") < layer("ebpo_verl.recipes")
    assert {"ast", "pathlib"} <= third_party(Path(__file__))
