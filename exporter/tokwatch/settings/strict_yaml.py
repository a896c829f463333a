"""Strict YAML settings files: parsed with the line of every key and item, `${ENV}` expanded, validated into
a pydantic model, and every problem reported as `file:line: field: message` (never a traceback).

The exporter's tokwatch.yml, sim.yml, the web config and bench files all load through here.
"""

from __future__ import annotations

import math
import os
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

# The largest whole number a setting takes (2**53: beyond it a float cannot hold the value exactly); a field
# with a tighter bound says so itself.
MAX_INTEGER = 2**53
# A document whose aliases expand to more nodes than this is refused before it is built: a YAML alias bomb
# (10**8 leaves in a few lines) cost 36.6 s of CPU on the event loop (issue 37).
MAX_EXPANDED_NODES = 100_000


def _number_kind(annotation: Any) -> type | None:
    """int or float when a field holds a number (optionally None), else None."""
    if annotation in (int, float):
        return typing.cast(type, annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kinds = {a for a in typing.get_args(annotation) if a is not type(None)}
        if kinds == {int} or kinds == {float}:
            return typing.cast(type, kinds.pop())
    return None


class ConfigError(Exception):
    """A configuration problem, already formatted as `file:line: field: message` lines."""


class StrictModel(BaseModel):
    """A settings section: an unknown key is an error, and the values are frozen once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _plain_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """A number field takes a finite number: not a boolean (`true` is not 1), not .inf or .nan, and a
        whole number (not 1e23, not 2.5) within MAX_INTEGER for an integer field."""
        if info.field_name is None:
            return value
        field = cls.model_fields.get(info.field_name)
        kind = _number_kind(field.annotation) if field is not None else None
        if kind is None or value is None:
            return value
        if isinstance(value, bool):
            raise ValueError(f"expected a number, not the boolean {str(value).lower()}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"must be a finite number, not {value}")
        if kind is int:
            if isinstance(value, float):
                raise ValueError(f"expected a whole number, not {value!r}")
            if isinstance(value, int) and abs(value) > MAX_INTEGER:
                raise ValueError(f"{value} is out of range (at most {MAX_INTEGER})")
        return value


_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that remembers the line of every mapping key and sequence item."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    mapping: dict[Any, Any] = {}
    lines: dict[Any, int] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in mapping:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        mapping[key] = loader.construct_object(value_node, deep=True)
        lines[key] = key_node.start_mark.line + 1
    return _LinedDict(mapping, lines, node.start_mark.line + 1)


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> list[Any]:
    items = [loader.construct_object(n, deep=True) for n in node.value]
    return _LinedList(items, [n.start_mark.line + 1 for n in node.value], node.start_mark.line + 1)


class _LinedDict(dict[Any, Any]):
    def __init__(self, data: Mapping[Any, Any], lines: dict[Any, int], line: int) -> None:
        super().__init__(data)
        self.lines = lines
        self.line = line


class _LinedList(list[Any]):
    def __init__(self, data: list[Any], lines: list[int], line: int) -> None:
        super().__init__(data)
        self.lines = lines
        self.line = line


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def _line_of(doc: Any, loc: tuple[Any, ...]) -> int | None:
    line: int | None = getattr(doc, "line", None)
    node = doc
    for part in loc:
        if isinstance(node, _LinedDict) and part in node:
            line = node.lines.get(part, line)
            node = node[part]
        elif isinstance(node, _LinedList) and isinstance(part, int) and 0 <= part < len(node):
            line = node.lines[part]
            node = node[part]
        else:
            break
    return line


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _expand_env(node: Any, path: tuple[Any, ...], problems: list[tuple[tuple[Any, ...], str]]) -> Any:
    if isinstance(node, _LinedDict):
        for key in list(node):
            node[key] = _expand_env(node[key], (*path, key), problems)
        return node
    if isinstance(node, _LinedList):
        for i, item in enumerate(node):
            node[i] = _expand_env(item, (*path, i), problems)
        return node
    if isinstance(node, str) and "${" in node:

        def repl(m: re.Match[str]) -> str:
            value = os.environ.get(m.group(1), m.group(2))
            if value is None:
                problems.append((path, f"environment variable {m.group(1)} is not set"))
                return ""
            return value

        return _ENV_RE.sub(repl, node)
    return node


def _clean_message(msg: str) -> str:
    return msg.removeprefix("Value error, ")


M = TypeVar("M", bound=BaseModel)


def _check_expansion(root: yaml.Node, filename: str) -> None:
    """Refuse a document whose aliases would expand it past MAX_EXPANDED_NODES (counted on the node graph,
    each node once, so the count itself is cheap)."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        if children_done or not children:
            size = 1 + sum(sizes[id(c)] for c in children)
            if size > MAX_EXPANDED_NODES:
                raise ConfigError(
                    f"{filename}:{node.start_mark.line + 1}: YAML aliases expand this document to more than "
                    f"{MAX_EXPANDED_NODES} values: refused"
                )
            sizes[id(node)] = size
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)


def parse_yaml_doc(text: str, filename: str) -> Any:
    """YAML text -> a mapping remembering line numbers, ${ENV} expanded; ConfigError names the line."""
    try:
        loader = _LineLoader(text)  # safe: _LineLoader derives from SafeLoader
        try:
            node = loader.get_single_node()
            if node is not None:
                _check_expansion(node, filename)
            doc = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{filename}:{mark.line + 1}" if mark else filename
        raise ConfigError(f"{where}: invalid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{filename}: invalid YAML: {exc}") from None
    if doc is None:
        doc = _LinedDict({}, {}, 1)
    if not isinstance(doc, dict):
        raise ConfigError(f"{filename}:1: the file must be a mapping of settings, not {type(doc).__name__}")
    problems: list[tuple[tuple[Any, ...], str]] = []
    doc = _expand_env(doc, (), problems)
    if problems:
        raise ConfigError(
            "\n".join(f"{filename}:{_line_of(doc, p) or 1}: {_field_path(p)}: {m}" for p, m in problems)
        )
    return doc


def line_of(doc: Any, loc: tuple[Any, ...]) -> int | None:
    """Line of the setting at `loc` in a document from `parse_yaml_doc` (None if unknown)."""
    return _line_of(doc, loc)


def format_validation_error(exc: ValidationError, filename: str, doc: Any = None) -> str:
    """`file:line: field: message` lines for a pydantic error (line left out when `doc` is None)."""
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        msg = "unknown setting" if err["type"] == "extra_forbidden" else _clean_message(err["msg"])
        line = _line_of(doc, loc) if doc is not None else None
        lines.append(f"{filename}{f':{line}' if line else ''}: {_field_path(loc)}: {msg}")
    return "\n".join(lines)


def validate_yaml(text: str, filename: str, model: type[M]) -> M:
    """Parse YAML text into `model`; raises ConfigError with `file:line: field: message` lines."""
    doc = parse_yaml_doc(text, filename)
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, filename, doc)) from None


def read_config_file(path: str | os.PathLike[str]) -> tuple[str, str]:
    """(text, display name) of a config file; raises ConfigError naming the file."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8"), str(p)
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read: {exc}") from None
