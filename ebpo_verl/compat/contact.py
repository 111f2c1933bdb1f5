"""Every private name of verl, Ray, Hydra, vLLM, torch and Python this package reads, calls, writes, patches,
overrides, copies or passes, in one list (:data:`CONTACTS`, the data of ``contacts.yaml``), with why and what public
API would replace it. ``docs/verl_contact.md`` is generated from it (``python -m ebpo_verl.compat.contact``).

Patches go through :func:`patch`, :func:`patched`, :func:`listed` and :func:`swapped`, which refuse an unlisted name.
Nothing here imports verl or vLLM at import time.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

OWNERS = ("verl", "ray", "hydra", "vllm", "torch", "transformers", "trl", "accelerate")
KINDS = ("read", "call", "write", "override", "patch", "copy")
PPO = "verl.trainer.ppo.v1.trainer_base.PPOTrainer"
LIST = Path(__file__).with_name("contacts.yaml")


@dataclass(frozen=True)
class Contact:
    """One name of another package that ours touches (one entry of ``contacts.yaml``).

    ``name`` is the dotted path by which our code reaches it; ``kinds`` what we do with it (:data:`KINDS`);
    ``where`` our modules that use it; ``params`` a callable's parameter names as recorded; ``instance``: an
    attribute that the owner's methods set on its instances (not on the class); ``probe``: the dotted path the
    test checks when ``name`` is not reachable without a running cluster; ``checked_by``: tests of its behaviour;
    ``scanned``: whether the source scan can see the use (a public name overridden is not a private name);
    ``keyword``: ``name`` is ``callable.keyword``, a private keyword our code passes to the callable."""

    name: str
    kinds: tuple[str, ...]
    where: tuple[str, ...]
    why: str
    public: str
    params: tuple[str, ...] | None = None
    instance: bool = False
    probe: str | None = None
    checked_by: tuple[str, ...] = ()
    scanned: bool = True
    keyword: bool = False

    @property
    def owner(self) -> str:
        """The package that owns the name (``python`` for the standard library)."""
        top = self.name.split(".")[0]
        return top if top in OWNERS else "python"

    @property
    def shown(self) -> str:
        """The name as the docs show it: ``ray.init(_temp_dir=...)`` for a keyword."""
        callee, _, keyword = self.name.rpartition(".")
        return f"{callee}({keyword}=...)" if self.keyword else self.name


def _load(entries: list[dict[str, Any]]) -> tuple[Contact, ...]:
    """The entries of ``contacts.yaml`` (``prefix`` goes before each name; ``names``: one entry per name)."""
    out = []
    for raw in entries:
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
        prefix, names = fields.pop("prefix", ""), fields.pop("names", None) or (fields.pop("name"),)
        fields["where"] = tuple(f"ebpo_verl.{w}" for w in fields["where"])
        out += [Contact(prefix + name, **fields) for name in names]
    return tuple(out)


_DATA = yaml.safe_load(LIST.read_text(encoding="utf-8"))
CONTACTS: tuple[Contact, ...] = _load(_DATA["contacts"])
"""The contact surface: every entry is checked by ``tests/test_contact_surface.py``."""

BY_NAME = {c.name: c for c in CONTACTS}

DROPPED: tuple[tuple[str, str], ...] = tuple(_DATA["dropped"].items())
"""Private names used before and replaced by public ones (listed for the record; the scan fails on their return)."""


def entry(name: str) -> Contact:
    """The listed entry ``name``; an unlisted name is refused in one line."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not in the contact list (ebpo_verl/compat/contacts.yaml): list it first") from None


def resolve(dotted: str) -> Any:
    """The object at ``dotted``: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        return functools.reduce(getattr, parts[cut:], obj)
    raise ImportError(f"no module of {dotted} can be imported")


def listed(name: str) -> Any:
    """The object of the listed entry ``name`` (a registry to write into, a private function to call)."""
    return resolve(entry(name).name)


def patch(name: str, value: Any) -> Any:
    """Replace the listed attribute ``name`` (kind ``patch``) by ``value``; returns what was there."""
    if "patch" not in entry(name).kinds:
        raise ValueError(f"{name} is listed, but not as a patch: list it as one in ebpo_verl/compat/contacts.yaml")
    owner, attr = name.rsplit(".", 1)
    target = resolve(owner)
    previous = getattr(target, attr)
    setattr(target, attr, value)
    return previous


@contextmanager
def patched(name: str, value: Any) -> Iterator[None]:
    """The listed attribute ``name`` (kind ``patch``) is ``value`` for the block, then what it was."""
    previous = patch(name, value)
    try:
        yield
    finally:
        patch(name, previous)


@contextmanager
def swapped(name: str, key: Any, value: Any) -> Iterator[None]:
    """``listed(name)[key]`` is ``value`` for the block (a registry entry), then what it was."""
    registry: MutableMapping[Any, Any] = listed(name)
    stock = registry[key]
    registry[key] = value
    try:
        yield
    finally:
        registry[key] = stock


def markdown() -> str:
    """``docs/verl_contact.md``: the list as a table per owner."""
    lines = [
        "# The contact surface with verl, Ray, Hydra and vLLM",
        "",
        "Generated by `python -m ebpo_verl.compat.contact > docs/verl_contact.md` from",
        "`ebpo_verl/compat/contacts.yaml` (`tests/test_contact_surface.py` keeps them equal). Every private name of",
        "another package that ebpo-verl reads, calls, writes, patches, overrides, copies or passes as a keyword, and",
        "every object of theirs it writes into; each entry is checked against the installed version by that test,",
        "which also fails on a private name that a Python file we ship or run uses unlisted.",
        f"{len(CONTACTS)} entries.",
    ]
    for owner in ("verl", "ray", "hydra", "vllm", "torch", "trl", "accelerate", "python"):
        rows = [c for c in CONTACTS if c.owner == owner]
        if rows:
            lines += [
                "",
                f"## {owner}",
                "",
                "| name | kind | used in | why | public replacement |",
                "|---|---|---|---|---|",
            ]
            lines += [
                f"| `{c.shown}` | {', '.join(c.kinds)} | {', '.join(w.removeprefix('ebpo_verl.') for w in c.where)} "
                f"| {c.why} | {c.public} |"
                for c in rows
            ]
    lines += ["", "## Replaced by public APIs", ""] + [f"- `{name}`: {how}" for name, how in DROPPED]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
