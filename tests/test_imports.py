"""Dependencies point one way: no circle of imports between the modules of ``ebpo_verl/``, nor
between their sub-packages; the layers point down and no module of the product imports an application. Every
import statement counts, at module level or inside a function (a lazy import is still a dependency), read from the
source with :mod:`ast`, nothing imported. The product holds no module-level mutable state but its listed caches
and stock ``main_ppo``'s default instances."""

from __future__ import annotations

import ast
import re
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


# The layers of the product from the bottom up (ebpo_verl/<unit>): a unit may import only the units of its own
# layer or below. The applications sit above them all.
LAYERS = (
    {"ebpo_verl.options", "ebpo_verl.ops", "ebpo_verl.version", "ebpo_verl.compat"},
    {"ebpo_verl.algos"},
    {"ebpo_verl.reward", "ebpo_verl.paper_reward", "ebpo_verl.data"},  # the rewards and the data sets' schemas
    {"ebpo_verl.trainer", "ebpo_verl.cpu"},
    {"ebpo_verl", "ebpo_verl.main", "ebpo_verl.evaluate", "ebpo_verl.integrations"},  # + the TRL integration
)
APPLICATIONS = (
    "ebpo_verl.recipes",
    "ebpo_verl.study",
    "ebpo_verl.smoke",
    "ebpo_verl.docs_tables",
    "benchmarks",
    "scripts",
)
"""Above the product: the paper's recipes (drive ebpo-train and the evaluation), the CPU study, the smoke runs and
their campaign, the benchmarks and the scripts. They import the product; nothing of the product imports them."""
# Outside packages the math may not import: it is torch and numpy only.
MATH_UNITS = ("ebpo_verl.options", "ebpo_verl.algos")
NOT_IN_MATH = ("verl", "ray", "vllm", "hydra", "omegaconf", "transformers")
MATH_MAY_IMPORT = ("ebpo_verl.ops.errors",)
"""Modules of a layer-0 unit the math may import besides its own: the one way to quote a value (stdlib only)."""


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
    above = {
        n: sorted(t for t in imported(p, n, known) if unit(t) not in MATH_UNITS and t not in MATH_MAY_IMPORT)
        for n, p in math_modules.items()
    }
    assert not any(above.values()), f"the math imports the layers above it: { {n: a for n, a in above.items() if a} }"


def test_the_layer_check_sees_an_upward_import():
    assert layer("ebpo_verl.algos") < layer("ebpo_verl.trainer") < layer("ebpo_verl.main") < layer("ebpo_verl.recipes")
    assert {"ast", "pathlib"} <= third_party(Path(__file__))


def test_every_unit_is_in_a_layer_or_an_application():
    _, by_unit = graphs()
    placed = set().union(*LAYERS) | set(APPLICATIONS)
    assert not set(by_unit) - placed, f"place these in LAYERS or APPLICATIONS: {sorted(set(by_unit) - placed)}"
    assert not set().union(*LAYERS) & set(APPLICATIONS)


def application_imports(by_module: Mapping[str, Iterable[str]], raw: Mapping[str, set[str]]) -> list[str]:
    """``module -> application`` for each import of an application by a module of the product (``raw``: the
    top-level names each module imports, for ``benchmarks`` and ``scripts``, which are outside the package)."""
    apps = tuple(APPLICATIONS)
    product = [m for m in by_module if not m.startswith(apps)]
    found = [f"{m} -> {t}" for m in product for t in sorted(by_module[m]) if t.startswith(apps)]
    return found + [f"{m} -> {t}" for m in product for t in sorted(raw.get(m, set()) & set(apps))]


def test_no_product_module_imports_an_application():
    by_module, _ = graphs()
    known = modules()
    raw = {name: third_party(path) for name, path in known.items()}
    assert by_module["ebpo_verl.recipes.driver"] & {"ebpo_verl.main"}  # the applications import the product
    assert application_imports({"ebpo_verl.trainer.x": {"ebpo_verl.smoke.selfcheck"}}, {"a": {"scripts"}}) == [
        "ebpo_verl.trainer.x -> ebpo_verl.smoke.selfcheck"
    ]
    assert application_imports({"ebpo_verl.ops.x": set()}, {"ebpo_verl.ops.x": {"benchmarks"}}) == [
        "ebpo_verl.ops.x -> benchmarks"
    ]
    found = application_imports(by_module, raw)
    assert not found, "the product imports an application: " + "; ".join(found)


SHIPPED = ("ebpo_verl", "benchmarks", "scripts", "data_prep")
"""What users run: the package (the wheel) and the checkout's product folders. The proof harness is ``tests/harness/``:
it imports the product and runs from a checkout (``python -m tests.harness``), so nothing of these may import it."""


def test_nothing_users_run_imports_the_tests_or_their_harness():
    assert "tests" in third_party(ROOT / "tests" / "test_campaign.py")  # the check sees an import of the harness
    shipped = [p for folder in SHIPPED for p in sorted((ROOT / folder).rglob("*.py"))]
    found = [str(p.relative_to(ROOT)) for p in shipped if "tests" in third_party(p)]
    assert not found, f"these import tests/ (the harness runs from a checkout, the wheel lacks it): {found}"


# ------------------------------------------------------------------------------------- module-level state
MUTABLE_CALLS = frozenset({"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter", "bytearray"})
MUTATORS = frozenset(
    {"append", "extend", "insert", "remove", "pop", "popitem", "clear", "update", "setdefault", "add", "discard"}
    | {"sort", "reverse", "move_to_end", "appendleft", "popleft"}
)
ALLOWED_STATE = {
    ("ebpo_verl.reward", "_VERDICTS"): "cache: math-verify verdicts by (gold, answer), LRU, at most _CACHE_SIZE",
    ("ebpo_verl.reward", "_POOL"): "cache of grading worker processes, at most MAX_WORKERS, shut at exit",
    ("ebpo_verl.trainer.run_options", "_LAST"): "cache for stock verl main_ppo, which calls a registered function "
    "each step with its raw algorithm node and nothing of ours that outlives the call: each estimator's last node "
    "value and its validated options (one entry per estimator), so a node is parsed and warned about once per value",
    ("ebpo_verl.trainer.adapter", "DEFAULT_ESTIMATORS"): "the default instances of stock verl.trainer.main_ppo",
    ("ebpo_verl.trainer.adapter", "ESTIMATORS"): "the functions registered in verl, made once at import from the "
    "registry and never written",
}
"""The module-level mutable state the product may hold, with why (``functools.cache`` on a function of a few
values, e.g. a trainer mode, is a cache too, and not counted)."""


def _mutable_classes(trees: Iterable[ast.AST]) -> set[str]:
    """Our classes whose instances can change: all but frozen dataclasses, named tuples and enums."""
    out = set()
    for node in (n for tree in trees for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        frozen = any("frozen=True" in ast.unparse(d) for d in node.decorator_list)
        if not frozen and not any(ast.unparse(b) in ("NamedTuple", "Enum", "str, Enum") for b in node.bases):
            out.add(node.name)
    return out


def _call_name(node: ast.AST) -> str | None:
    func = node.func if isinstance(node, ast.Call) else None
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _holds_state(value: ast.AST, classes: set[str]) -> bool:
    """Whether ``value`` makes an instance of a mutable class of ours, or a container of objects made at import
    (``{name: cls() for ...}``)."""
    if _call_name(value) in classes:
        return True
    if isinstance(value, (ast.ListComp, ast.SetComp, ast.DictComp, ast.List, ast.Set, ast.Dict)):
        return any(isinstance(n, ast.Call) and _call_name(n) not in ("tuple", "frozenset") for n in ast.walk(value))
    return False


def _written(trees: Iterable[ast.AST]) -> set[str]:
    """Names whose items, attributes or contents some code changes (``x[k] = v``, ``del x[k]``, ``x.append(...)``,
    ``x += ...``, ``x.a = v``), the name being ``x`` or ``module.x``."""
    owners = []
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, (ast.Assign, ast.Delete)):
            owners += [t.value for t in node.targets if isinstance(t, (ast.Subscript, ast.Attribute))]
        elif isinstance(node, ast.AugAssign):
            owners.append(node.target.value if isinstance(node.target, (ast.Subscript, ast.Attribute)) else node.target)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            owners.append(node.func.value)
    return {o.id if isinstance(o, ast.Name) else o.attr for o in owners if isinstance(o, (ast.Name, ast.Attribute))}


def module_state(sources: Mapping[str, str], readers: Iterable[str] = ()) -> dict[tuple[str, str], int]:
    """(module, name) -> line of each module-level binding of ``sources`` that holds mutable state: a container
    (a display, a comprehension, a mutable built-in) that code of ``sources`` or ``readers`` writes into, an
    instance of a mutable class of ours, or a container of objects made at import. ``__all__`` is not state."""
    trees = {m: ast.parse(text) for m, text in sources.items()}
    all_trees = [*trees.values(), *map(ast.parse, readers)]
    classes, written = _mutable_classes(all_trees), _written(all_trees)
    found = {}
    for module, tree in trees.items():
        for node in tree.body:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            containers = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
            container = isinstance(node.value, containers) or _call_name(node.value) in MUTABLE_CALLS
            for name in (n for n in names if n != "__all__"):
                if (container and name in written) or _holds_state(node.value, classes):
                    found[(module, name)] = node.lineno
    return found


def test_the_product_holds_no_module_level_state_but_the_listed():
    known = modules()
    product = {m: p.read_text(encoding="utf-8") for m, p in known.items() if not m.startswith(APPLICATIONS)}
    readers = [p.read_text(encoding="utf-8") for m, p in known.items() if m.startswith(APPLICATIONS)]
    folders = ("benchmarks", "scripts", "tests/harness")
    readers += [p.read_text(encoding="utf-8") for d in folders for p in (ROOT / d).glob("*.py")]
    found = module_state(product, readers)
    unlisted = sorted(f"{m}:{found[m, n]} {n}" for m, n in set(found) - set(ALLOWED_STATE))
    assert not unlisted, f"module-level mutable state: {unlisted} (pass it in, or list it in ALLOWED_STATE, why)"
    assert not set(ALLOWED_STATE) - set(found), f"listed but gone: {sorted(set(ALLOWED_STATE) - set(found))}"


def test_the_state_check_sees_each_kind():
    planted = {
        "m": "import collections\n\nTABLE = {'a': 1}\nSEEN = []\nLRU = collections.OrderedDict()\n"
        "POOL = Pool()\nMADE = {k: Pool() for k in 'ab'}\nKEYS = ('a',)\n__all__ = ['f']\n\n"
        "class Pool:\n    pass\n\n\ndef f(x):\n    SEEN.append(x)\n    LRU[x] = 1\n",
        "n": "from m import TABLE\n\nTABLE.update(b=2)\n",
    }
    assert module_state(planted) == {("m", "TABLE"): 3, ("m", "SEEN"): 4, ("m", "LRU"): 5, ("m", "POOL"): 6,
                                     ("m", "MADE"): 7}  # fmt: skip
    assert module_state({"m": planted["m"]}) == {("m", "SEEN"): 4, ("m", "LRU"): 5, ("m", "POOL"): 6, ("m", "MADE"): 7}


def test_the_architecture_page_names_files_that_exist_and_every_layer():
    """``docs/architecture.md``: each file or folder it names in backticks exists (from the repository root or
    ``ebpo_verl/``), and its layer table names every unit of :data:`LAYERS` and :data:`APPLICATIONS`."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = {
        t for t in re.findall(r"`([\w./<>-]+)`", page) if t.endswith((".py", ".md", ".yaml", "/")) and "<" not in t
    }
    assert len(named) > 30
    missing = sorted(t for t in named if not (ROOT / t).exists() and not (ROOT / "ebpo_verl" / t).exists())
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"
    units = {u.removeprefix("ebpo_verl.").replace(".", "/") for u in set().union(*LAYERS, APPLICATIONS)} - {"ebpo_verl"}
    absent = sorted(u for u in units if f"`{u}/`" not in page and f"`{u}.py`" not in page)
    assert not absent, f"docs/architecture.md's layers lack: {absent}"
