"""The configuration reference page, generated from the schema so that it cannot drift.

Reads :mod:`rft.config.schema`'s dataclasses (types, defaults, ranges) and the comment next to
each field in its source, and :mod:`rft.config.known_names` (the Trinity-RFT/veRL names rft
refuses, with what to do instead). ``python -m rft.config.reference > docs/config-reference.md``
writes the page; ``tests/test_docs.py`` checks that the committed page equals :func:`render`.
Nothing here is read at run time.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import sys
import tokenize
import typing
from typing import Any, Literal, Union

from rft.config import known_names, schema

COMMAND = "python -m rft.config.reference > docs/config-reference.md"


@dataclasses.dataclass
class Section:
    """One dataclass of the schema, at the first key path that reaches it."""

    cls: type
    path: str  # e.g. buffer.explorer_input.taskset ("" for the top level)
    about: str  # the comment of the field that holds it
    also: list[str] = dataclasses.field(default_factory=list)  # other paths to the same class


def _comments(source: str) -> dict[int, str]:
    """Line number -> the text of the ``#`` comment on that line."""
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found[tok.start[0]] = tok.string.lstrip("#").strip()
    return found


def field_notes(cls: type) -> tuple[str, dict[str, str]]:
    """(the class's note, {field: its comment}) from the class's source. A comment block right
    above the first field is the class's note; one above a later field is part of its text."""
    lines, _ = inspect.getsourcelines(cls)
    source = "".join(lines)
    comments = _comments(source)
    code_lines = {i for i, line in enumerate(lines, 1) if line.strip() and i not in comments}
    code_lines |= {i for i in comments if not lines[i - 1].lstrip().startswith("#")}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    note, notes = "", {}
    fields = [s for s in body.body if isinstance(s, ast.AnnAssign)]
    for index, stmt in enumerate(fields):
        above = []
        line = stmt.lineno - 1
        while line in comments and line not in code_lines:
            above.insert(0, comments[line])
            line -= 1
        trailing = [comments[i] for i in range(stmt.lineno, stmt.end_lineno + 1) if i in comments]
        block = " ".join(above).rstrip(".")
        if index == 0 and block:
            note, block = block, ""
        notes[stmt.target.id] = "; ".join(part for part in (block, " ".join(trailing)) if part)
    return note, notes


def _nested(tp: Any) -> tuple[type | None, str]:
    """The dataclass a field's type holds and how its key path continues (``""``, ``[i]`` for a
    list, ``.<name>`` for a mapping); (None, "") for plain values."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return tp, ""
    if origin is Union:
        for arg in args:
            found, suffix = _nested(arg)
            if found:
                return found, suffix
    if origin is list and args and dataclasses.is_dataclass(args[0]):
        return args[0], "[i]"
    if origin is dict and len(args) == 2 and dataclasses.is_dataclass(args[1]):
        return args[1], ".<name>"
    return None, ""


def sections() -> list[Section]:
    """Every dataclass reachable from :class:`~rft.config.schema.Config`, depth first."""
    found: dict[type, Section] = {}

    def walk(cls: type, path: str, about: str) -> None:
        if cls in found:
            found[cls].also.append(path)
            return
        found[cls] = Section(cls, path, about)
        hints = typing.get_type_hints(cls)
        _, notes = field_notes(cls)
        for f in dataclasses.fields(cls):
            nested, suffix = _nested(hints[f.name])
            if f.init and nested:
                walk(nested, f"{path}.{f.name}{suffix}".lstrip("."), notes.get(f.name, ""))

    walk(schema.Config, "", "")
    return list(found.values())


def show_type(tp: Any) -> str:
    """A field's type in words: ``grpo`` \\| ``ppo``, ``int or null``, ``list of str``..."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin is Union:
        # Sorted: typing caches equal Unions, so the order of ``args`` is that of whichever
        # spelling the process built first, not of this field's annotation.
        shown = sorted(show_type(a) for a in args if a is not type(None))
        return " or ".join(shown) + (" or null" if type(None) in args else "")
    if origin is list:
        return f"list of {show_type(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping of {show_type(args[1])}" if args else "mapping"
    if dataclasses.is_dataclass(tp):
        return "section"
    return getattr(tp, "__name__", str(tp))


def show_default(f: dataclasses.Field) -> str:
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return "(section)"
    else:
        value = f.default
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'`"{value}"`' if value == "" else f"`{value}`"
    return f"`{value!r}`".replace("'", "")


def show_range(f: dataclasses.Field) -> str:
    """``>= 1``, ``> 0, <= 1``: the bounds :func:`rft.config.typed_dict.field` checks."""
    signs = {"ge": ">=", "gt": ">", "le": "<="}
    return ", ".join(f"{signs[k]} {f.metadata[k]}" for k in signs if k in f.metadata)


def _escape(text: str) -> str:
    """Comment text as Markdown table text: ``|``, ``*``, ``<`` and ``>`` kept literal."""
    for char, escaped in (("|", "\\|"), ("*", "\\*"), ("<", "&lt;"), (">", "&gt;")):
        text = text.replace(char, escaped)
    return text


def _anchor(path: str) -> str:
    """GitHub's anchor of the heading ``path`` renders to."""
    keep = "".join(c for c in f"{path}".lower() if c.isalnum() or c in "-_ ")
    return keep.replace(" ", "-")


def _heading(section: Section) -> str:
    return f"`{section.path}`" if section.path else "Top level"


def key_table(section: Section, by_class: dict[type, Section]) -> list[str]:
    hints = typing.get_type_hints(section.cls)
    _, notes = field_notes(section.cls)
    rows = ["| key | type | default | range | what it does |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(section.cls):
        if not f.init:
            continue
        nested, _ = _nested(hints[f.name])
        kind = show_type(hints[f.name])
        if nested:
            target = by_class[nested]
            link = f"[{target.path}](#{_anchor(_heading(target))})"
            kind = kind.replace("section", link) if "section" in kind else link
        note = _escape(notes.get(f.name, ""))
        rows.append(f"| `{f.name}` | {kind} | {show_default(f)} | {show_range(f)} | {note} |")
    return rows


def _refused_key(section: Section, key: str) -> str:
    shown = f"`{f'{section.path}.{key}'.lstrip('.')}`"
    return f"{shown} (\\*)" if section.also else shown


def refused_names(by_name: dict[str, Section]) -> list[str]:
    """The Trinity/veRL keys and choices of :mod:`rft.config.known_names`, at their key paths."""
    out = ["| key | what to do in rft |", "|---|---|"]
    for cls_name, keys in known_names.KEYS.items():
        for key, what in keys.items():
            out.append(f"| {_refused_key(by_name[cls_name], key)} | {_escape(what)} |")
    out += ["", '(\\*) and at each other path of that section (its "Also at" line above).']
    out += ["", "Values of keys rft has, that rft refuses:", ""]
    out += ["| key: value | what to do in rft |", "|---|---|"]
    for place, values in known_names.CHOICES.items():
        cls_name, key = place.split(".")
        section = by_name[cls_name]
        accepted = typing.get_args(_literal(typing.get_type_hints(section.cls)[key]))
        for value, what in values.items():
            if value not in accepted:  # a name rft implements is accepted, never refused
                shown = _refused_key(section, key).replace(f"{key}`", f"{key}: {value}`", 1)
                out.append(f"| {shown} | {_escape(what)} |")
    return out


def _literal(tp: Any) -> Any:
    """The ``Literal[...]`` inside ``Optional[Literal[...]]`` (or ``tp`` itself)."""
    if typing.get_origin(tp) is Union:
        return next((a for a in typing.get_args(tp) if typing.get_origin(a) is Literal), tp)
    return tp


def _named_table(title: str, names: dict[str, str]) -> list[str]:
    rows = [f"| {title} | what it is, what to do |", "|---|---|"]
    return rows + [f"| `{name}` | {_escape(what)} |" for name, what in names.items()]


def render() -> str:
    """The whole page, as committed at docs/config-reference.md."""
    found = sections()
    by_class = {s.cls: s for s in found}
    by_name = {s.cls.__name__: s for s in found}
    out = [
        "# Configuration reference",
        "",
        f"<!-- Generated from rft/config/schema.py and rft/config/known_names.py by `{COMMAND}`;",
        "do not edit by hand: tests/test_docs.py fails when this page and the schema differ. -->",
        "",
        "Every key rft reads, with its type, default, allowed range and the comment it has in",
        "`rft/config/schema.py`. A key path with `[i]` is a list item (`tasksets.0.split=test` on",
        "the command line), `<name>` a mapping key you choose. What each Trinity-RFT key does in",
        "rft, derived values and the checks between keys are in",
        "[configuration.md](configuration.md); the algorithm names in",
        "[algorithms.md](algorithms.md). Keys Trinity-RFT or veRL define and rft refuses are at",
        "the end ([Refused Trinity-RFT and veRL names](#refused-trinity-rft-and-verl-names)).",
        "",
    ]
    for section in found:
        note, _ = field_notes(section.cls)
        out += [f"## {_heading(section)}", ""]
        about = _escape(section.about or "the keys at the top of a config file")
        out += [f"`{section.cls.__name__}`: {about}."]
        if note:
            out += ["", _escape(note)]
        if section.also:
            out += ["", "Also at: " + ", ".join(f"`{p}`" for p in section.also) + "."]
        out += [""] + key_table(section, by_class) + [""]
    out += ["## Refused Trinity-RFT and veRL names", ""]
    out += [
        "A key, choice, workflow or reward that Trinity-RFT (or veRL, as Trinity embeds it under",
        "`trainer.trainer_config`) defines and rft does not act on is refused by name with the",
        'text below ("Trinity\'s `X` is not supported by rft: ..."), never with a guess at a',
        "similar rft name. Where the names come from (Trinity-RFT's repository):",
        "",
    ]
    out += [f"- {what}: {source}" for what, source in known_names.SOURCES.items()]
    out += ["", "Keys:", ""] + refused_names(by_name) + [""]
    out += ["Workflows (`default_workflow_type` and the like):", ""]
    out += _named_table("workflow", known_names.WORKFLOWS) + [""]
    out += ["Reward functions (`default_reward_fn_type`):", ""]
    out += _named_table("reward", known_names.REWARD_FNS)
    return "\n".join(out) + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
