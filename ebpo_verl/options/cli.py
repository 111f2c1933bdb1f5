"""Command lines and environment switches from option declarations (:class:`~.parsing.OptionSection`).

:func:`add_options` builds argparse arguments: help ends with the default and allowed values, values are checked
by :func:`~.parsing.accepts`, a bad value is one line ``PROG: error: ...``, exit 2 (:class:`OneLineParser`).
:func:`options_table` renders the same declarations as a docs table. Not jsonargparse/tyro: one rule set for
config keys, env variables and flags, no dependency beyond verl's pins. Imports only :mod:`.parsing`.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import MISSING, Field, fields
from typing import Any, NoReturn, TypeVar

from ebpo_verl.options.parsing import OptionSection, accepts, allowed, shown, word

T = TypeVar("T", bound=OptionSection)


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser whose refusals are one line (``PROG: error: ...``, exit status 2), not usage + error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def flag(name: str) -> str:
    """The command-line flag of option ``name`` (``max_new_tokens`` -> ``--max-new-tokens``)."""
    return "--" + name.replace("_", "-")


def flag_of(f: Field) -> str:
    """The command-line flag of a declared option (its own ``flag``, else :func:`flag` of its name)."""
    return f.metadata.get("flag") or flag(f.name)


def _kind(cls: type, name: str) -> tuple[type, bool]:
    """(scalar type, many) of a field's annotation: ``int | None`` -> (int, False), ``tuple[str, ...]`` -> (str,
    True)."""
    hint = typing.get_type_hints(cls)[name]
    many = typing.get_origin(hint) in (tuple, list)
    if many:
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint, many


def converter(f: Field, scalar: type) -> Callable[[str], Any]:
    """The argparse ``type`` of option ``f``: ``null`` for None, else the scalar type, then the option's rules."""

    def convert(text: str) -> Any:
        value: Any = text
        if text in ("null", "None") and accepts(f, None):
            value = None
        elif scalar in (int, float):
            with suppress(ValueError):
                value = scalar(text)
        if not accepts(f, value):
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; use {allowed(f)}")
        return value

    return convert


def _is_choice_argument(f: Field) -> bool:
    """A positional argument that takes only listed words: shown, checked and refused as argparse's choices."""
    return not flag_of(f).startswith("-") and _metavar(f).startswith("{")


def help_text(f: Field) -> str:
    """An option's help with its declared default and the values it accepts (what ``--help`` shows; a choice
    argument's help as declared, its words shown as ``{a,b}``)."""
    if _is_choice_argument(f):
        return f.metadata["help"].replace("%", "%%")
    default = "required" if f.default is MISSING else f"default {shown(f.default)}"
    accepted = "" if f.metadata["choices"] == (True, False) else f"; {allowed(f)}"  # a switch: --x / --no-x
    return f"{f.metadata['help']} ({default}{accepted})".replace("%", "%%")


def _metavar(f: Field) -> str:
    """``{a,b}`` for an option that takes only listed words, else its name in capitals."""
    choices = f.metadata["choices"]
    if choices and f.metadata["rule"] is None and not isinstance(f.default, tuple):
        return "{" + ",".join(word(c) for c in choices) + "}"
    return f.name.upper()


def add_options(parser: argparse.ArgumentParser, cls: type[OptionSection]) -> None:
    """One argument per option of ``cls``: ``--flag VALUE`` (``--flag V [V ...]`` for a tuple, ``--flag`` /
    ``--no-flag`` for a bool), its default and help from the declaration; an option whose ``flag`` is a word
    without dashes (``RUN``) is a positional argument of that name, one that takes only listed words shown and
    refused as argparse's choices (``{rl,mse}``, its help as declared)."""
    for f in fields(cls):
        scalar, many = _kind(cls, f.name)
        optional = f.default is not MISSING
        kwargs: dict[str, Any] = {"help": help_text(f), **({"default": f.default} if optional else {})}
        nargs = ("*" if optional else "+") if many else ("?" if optional else None)
        if _is_choice_argument(f):
            parser.add_argument(f.name, nargs=nargs, choices=f.metadata["choices"], **kwargs)
        elif not flag_of(f).startswith("-"):  # a positional argument
            parser.add_argument(f.name, metavar=flag_of(f), nargs=nargs, type=converter(f, scalar), **kwargs)
        elif scalar is bool:
            action = argparse.BooleanOptionalAction
            parser.add_argument(flag_of(f), dest=f.name, required=not optional, action=action, **kwargs)
        else:
            metavar, nargs = f.metadata.get("metavar") or _metavar(f), "+" if many else None
            parser.add_argument(flag_of(f), dest=f.name, required=not optional, type=converter(f, scalar),
                                metavar=metavar, nargs=nargs, **kwargs)  # fmt: skip


def parse_options(cls: type[T], namespace: argparse.Namespace, parser: argparse.ArgumentParser) -> T:
    """The ``cls`` object of parsed arguments (tuples for lists); a check between options that fails is the
    parser's one-line error."""
    values = {f.name: getattr(namespace, f.name) for f in fields(cls)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    try:
        return cls(**values)
    except ValueError as err:
        parser.error(str(err))


def parse(cls: type[T], prog: str | None, argv: Sequence[str] | None = None, description: str = "", **settings) -> T:
    """A command whose options are ``cls``: its parser built (``prog``: None for the script's name; ``settings``:
    more of argparse's parser arguments, e.g. ``epilog``), ``argv`` (default: this process's) parsed once into
    ``cls``, checked by its rules."""
    parser = OneLineParser(prog=prog, description=description, **settings)
    add_options(parser, cls)
    return parse_options(cls, parser.parse_args(sys.argv[1:] if argv is None else argv), parser)


def options_table(
    cls: type[OptionSection], name: Callable[[str], str] | None = None, unset: str = "null", head: str = "option"
) -> str:
    """A Markdown table of ``cls``'s options (``head``: its name, default, allowed values, help), for a docs page;
    ``name`` writes an option's name (default: its flag); ``unset`` names the value None (``unset`` for environment
    switches)."""
    rows = [f"| {head} | default | allowed | what |", "|---|---|---|---|"]
    for f in fields(cls):
        default = "(required)" if f.default is MISSING else f"`{shown(f.default)}`".replace("`null`", unset)
        accepted = allowed(f).replace("null", unset, 1) if None in f.metadata["choices"] else allowed(f)
        written = name(f.name) if name else flag_of(f)
        rows.append(f"| `{written}` | {default} | {cell(accepted)} | {cell(f.metadata['help'])} |")
    return "\n".join(rows) + "\n"


def cell(text: str) -> str:
    """Text in a Markdown table cell: ``|`` and ``<`` escaped."""
    return text.replace("|", "\\|").replace("<", "&lt;")


def switches_help(cls: type[OptionSection], after: Mapping[str, str] | None = None, width: int = 110) -> str:
    """The ``--help`` lines of environment switches declared by ``cls`` (one field per variable; None: unset):
    ``NAME  help (default X; one of a | b)``; ``after[name]``, when given, follows that switch's lines instead of
    its list of words."""
    after = after or {}
    lines: list[str] = []
    pad = max(15, *(len(f.name) + 1 for f in fields(cls)))
    for f in fields(cls):
        words = [word(c) for c in f.metadata["choices"] if c is not None]
        notes = [f"default {shown(f.default)}"] if f.default is not None else []
        if words and f.metadata["rule"] is None and f.name not in after:
            notes.append("one of " + " | ".join(words))
        entry = f.metadata["help"] + (f" ({'; '.join(notes)})" if notes else "")
        lines += textwrap.wrap(entry, width, initial_indent=f"  {f.name:<{pad}}", subsequent_indent=" " * (pad + 2))
        lines += [after[f.name]] if f.name in after else []
    return "\n".join(lines)
