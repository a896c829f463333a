"""The generated dashboards in Grafana 11.6's own model: no nulls, no legacy keys, loaded by
grafana-foundation-sdk 11.6 (PyPI) and type-checked by tsc against @grafana/schema 11.6 (npm, installed on
first use into tests/dashboards/grafana_schema/node_modules)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards import generate, grafana_model
from tests.npm_packages import install

CHECK_DIR = Path(__file__).parent / "grafana_schema"
DASHBOARDS = sorted(generate.JSON_DIR.glob("*.json"))
# Fields of a Prometheus annotation that the SDK's core AnnotationQuery does not model: the query in
# `target` and the display fields Grafana's Prometheus plugin reads (typed in grafana_schema/schema.ts).
PLUGIN_ANNOTATION_FIELDS = {"target", "tagKeys", "titleFormat", "textFormat", "useValueForTime"}


def _load(path: Path) -> dict[str, Any]:
    model: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return model


def _walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every node; list items as `[i]`."""
    yield path, value
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _walk(child, f"{path}.{key}")
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _walk(child, f"{path}[{i}]")


def test_the_generated_dashboards_are_all_five() -> None:
    assert [p.name for p in DASHBOARDS] == sorted(generate.DASHBOARDS)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_no_nulls_but_the_base_threshold_step(path: Path) -> None:
    """Grafana writes the base threshold step as `"value": null` (-Infinity) and the schema requires the
    field (`value: number | null`); no other null is left."""
    nulls = [where for where, value in _walk(_load(path)) if value is None]
    assert [n for n in nulls if not n.endswith(".steps[0].value")] == []


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_no_legacy_keys_and_datasources_are_references(path: Path) -> None:
    model = _load(path)
    assert not set(grafana_model._DASHBOARD) & set(model)
    assert not set(grafana_model._TIMEPICKER) & set(model.get("timepicker", {}))
    for panel in model["panels"]:
        if panel["type"] == "row":
            assert set(panel) <= set(grafana_model._ROW_KEEP), panel["title"]
            continue
        assert not set(grafana_model._PANEL) & set(panel), panel["title"]
        for target in panel.get("targets", []):
            assert not set(grafana_model._TARGET) & set(target), panel["title"]
    for variable in model["templating"]["list"]:
        assert not set(grafana_model._VARIABLE + grafana_model._INTERVAL_ONLY) & set(variable)
    # A bare-string datasource (a name) is the pre-8 form; Grafana 11 expects {type, uid}.
    refs = [(w, v) for w, v in _walk(model) if w.endswith(".datasource")]
    assert refs and all(isinstance(v, dict) and set(v) <= {"type", "uid"} and v.get("uid") for _, v in refs)


def _lost_keys(ours: Any, back: Any, path: str = "") -> Iterator[str]:
    """Keys of `ours` the SDK's round trip did not keep (keys it does not model)."""
    if isinstance(ours, dict) and isinstance(back, dict):
        for key, value in ours.items():
            if key not in back:
                yield f"{path}.{key}"
            else:
                yield from _lost_keys(value, back[key], f"{path}.{key}")
    elif isinstance(ours, list) and isinstance(back, list):
        for i, (a, b) in enumerate(zip(ours, back, strict=False)):
            yield from _lost_keys(a, b, f"{path}[{i}]")


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_loads_in_grafana_foundation_sdk_and_keeps_every_key(path: Path) -> None:
    """`Dashboard.from_json` (it raised TypeError on the nulls); with the panel and query plugins registered,
    a round trip keeps every key but the Prometheus annotation's plugin fields: the SDK models each one."""
    plugins.register_default_plugins()
    model = _load(path)
    back = json.loads(json.dumps(Dashboard.from_json(model), cls=JSONEncoder))
    lost = [
        where
        for where in _lost_keys(model, back)
        if not (where.startswith(".annotations.list[") and where.split(".")[3] in PLUGIN_ANNOTATION_FIELDS)
    ]
    assert lost == []
    assert len(back["panels"]) == len(model["panels"])


@pytest.mark.grafana_schema
def test_type_checks_against_grafana_schema_with_tsc(tmp_path: Path) -> None:
    """Every dashboard as `const d: DashboardJson = <JSON>` compiled with tsc --strict (schema.ts): wrong
    types, unknown enum values, missing required fields and keys the model does not define are errors."""
    reason = install(CHECK_DIR, "@grafana/schema", "typescript")
    if reason:
        print(f"skipping the @grafana/schema type check: {reason}")
        pytest.skip(reason)
    for name in ("schema.ts", "tsconfig.json"):
        shutil.copy(CHECK_DIR / name, tmp_path / name)
    (tmp_path / "node_modules").symlink_to(CHECK_DIR / "node_modules", target_is_directory=True)
    for path in DASHBOARDS:
        ident = path.stem.replace("-", "_")
        (tmp_path / f"{ident}.ts").write_text(
            'import type { DashboardJson } from "./schema.js";\n'
            f"export const {ident}: DashboardJson = {path.read_text(encoding='utf-8')};\n",
            encoding="utf-8",
        )
    tsc = CHECK_DIR / "node_modules" / "typescript" / "bin" / "tsc"
    proc = subprocess.run(
        ["node", str(tsc), "-p", str(tmp_path)], capture_output=True, text=True, timeout=300, check=False
    )
    errors = [line for line in proc.stdout.splitlines() if "error TS" in line]
    assert proc.returncode == 0 and errors == [], proc.stdout[-3000:] + proc.stderr[-1000:]


@pytest.mark.grafana_schema
def test_the_type_check_catches_a_legacy_key_a_null_and_a_bad_enum(tmp_path: Path) -> None:
    """The check is not vacuous: one panel key Grafana no longer reads, one null, one unknown enum value."""
    reason = install(CHECK_DIR, "@grafana/schema", "typescript")
    if reason:
        pytest.skip(reason)
    for name in ("schema.ts", "tsconfig.json"):
        shutil.copy(CHECK_DIR / name, tmp_path / name)
    (tmp_path / "node_modules").symlink_to(CHECK_DIR / "node_modules", target_is_directory=True)
    model = _load(DASHBOARDS[0])
    first, second = [p for p in model["panels"] if p["type"] != "row"][:2]
    first["span"] = 4  # tsc reports one problem per object literal: one mistake per panel
    second["fieldConfig"]["defaults"]["thresholds"]["mode"] = "absolut"
    model["templating"]["list"][0]["description"] = None
    header = 'import type { DashboardJson } from "./schema.js";\n'
    (tmp_path / "bad.ts").write_text(
        f"{header}export const bad: DashboardJson = {json.dumps(model, indent=1)};\n", encoding="utf-8"
    )
    tsc = CHECK_DIR / "node_modules" / "typescript" / "bin" / "tsc"
    proc = subprocess.run(
        ["node", str(tsc), "-p", str(tmp_path)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode != 0
    assert "'\"span\"' does not exist" in proc.stdout
    assert "'\"absolut\"' is not assignable" in proc.stdout
    assert "Type 'null' is not assignable" in proc.stdout
