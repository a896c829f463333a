"""The registry of kinds is the only place a kind lives: every kind answers for itself, and everyone asks.

Adding a kind = its module under tokwatch/probes/, its entry in `PROBES`, its name in
`tokwatch.settings.kinds.Kind` and its tests; these tests fail when one of the first three is missing or when
a kind literal creeps back into a module outside the registry.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import get_args

import pytest
from pydantic import ValidationError

import tokwatch
from tokwatch.bench.commands import add_commands, options_from_args
from tokwatch.bench.config import BenchOptions
from tokwatch.counters.adapters import ADAPTERS
from tokwatch.probes import PROBES, metrics_url, probe_class
from tokwatch.probes.http import ChatRequest
from tokwatch.settings.config import EndpointSettings
from tokwatch.settings.kinds import Kind

KINDS = sorted(PROBES)
PACKAGE = Path(tokwatch.__file__).parent
# The simulator emulates servers (its own `dialect` vocabulary); the registry and the names are the home.
NOT_SCANNED = ("probes/", "sim/", "settings/kinds.py")


def _bench_args(kind: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", "--url", "http://127.0.0.1:1/v1", "--model", "m", "--kind", kind])


def test_config_kinds_are_the_registry() -> None:
    assert sorted(get_args(Kind)) == KINDS
    assert all(PROBES[k].kind == k for k in KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_config_and_bench_accept_every_registered_kind(kind: str) -> None:
    ep = EndpointSettings(name="e", kind=kind, base_url="http://127.0.0.1:1/v1", model="m")
    assert probe_class(ep.kind).kind == kind
    assert options_from_args(_bench_args(kind)).kind == kind


def test_an_unregistered_kind_is_refused_everywhere() -> None:
    with pytest.raises(ValidationError):
        EndpointSettings(name="e", kind="dynamo", base_url="http://127.0.0.1:1", model="m")
    with pytest.raises(ValidationError):
        BenchOptions(url="http://127.0.0.1:1", model="m", kind="dynamo")
    with pytest.raises(ValueError, match="unknown endpoint kind 'dynamo'"):
        probe_class("dynamo")
    with pytest.raises(SystemExit):
        _bench_args("dynamo")


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_answers_for_itself(kind: str) -> None:
    cls = probe_class(kind)
    assert cls.url("http://127.0.0.1:1/base/v1").startswith("http://127.0.0.1:1/base/")
    request = ChatRequest("m", [{"role": "user", "content": "hi"}], 7, stream=True, temperature=0.0)
    body = cls.body(request)
    assert body["model"] == "m" and body["stream"] is True and body["messages"][-1]["content"] == "hi"
    fields = cls.fixed_output_fields(7)
    fixed = cls.body(ChatRequest("m", [], 7, stream=True, temperature=0.0, fixed_output=True))
    assert fixed.items() >= fields.items() and not body.keys() & fields.keys()
    assert cls.wants_fixed_output(None) is cls.fixed_length and cls.wants_fixed_output(False) is False
    assert not cls.fixed_length or fields  # a kind honouring fixed output has fields to send
    parser = cls.parser()
    assert parser.feed(b"", 0.0) == [] and parser is not cls.parser()
    assert cls.counter_adapter is None or cls.counter_adapter in ADAPTERS
    default = cls.default_metrics_url("http://127.0.0.1:1/base/v1")
    assert default == ("http://127.0.0.1:1/base/metrics" if cls.counter_adapter else None)
    ep = EndpointSettings(name="e", kind=kind, base_url="http://127.0.0.1:1/base/v1", model="m")
    assert metrics_url(ep) == default


def _kind_literals(node: ast.AST) -> set[str]:
    values = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return {v.value for v in values if isinstance(v, ast.Constant) and v.value in PROBES}


def _names_a_kind(node: ast.AST) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name in ("kind", "_kind")


def test_no_module_outside_the_registry_restates_a_kind() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(NOT_SCANNED):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_names_a_kind(s) for s in sides) and any(_kind_literals(s) for s in sides):
                    found.append(f"{rel}:{node.lineno}")
            elif isinstance(node, ast.Tuple | ast.List | ast.Set) and len(_kind_literals(node)) >= 2:
                found.append(f"{rel}:{node.lineno}")
    assert found == []
