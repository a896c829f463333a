"""/metrics from pre-rendered parts: the samples of a full render, re-rendered only where changed."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from tests.metrics.test_metrics import CONFIG, ok_run
from tokwatch.metrics.exposition import Exposition, Families, _One, negotiate, render_families
from tokwatch.metrics.probe import ProbeMetrics


def samples(text: bytes) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for fam in text_string_to_metric_families(text.decode())
        for s in fam.samples
    }


def probe_metrics() -> tuple[ProbeMetrics, Exposition]:
    pm = ProbeMetrics()
    pm.set_endpoints(CONFIG.endpoints)
    exposition = Exposition()
    exposition.register(pm)
    return pm, exposition


def test_parts_give_the_same_samples_as_a_full_render() -> None:
    pm, exposition = probe_metrics()
    pm.record(ok_run("a", 50.0))
    pm.record(ok_run("b", 20.0))
    assert samples(exposition.render()) == samples(generate_latest(pm))  # type: ignore[arg-type]


def test_only_changed_endpoints_are_rendered_again() -> None:
    pm, exposition = probe_metrics()
    first = exposition.render()
    assert exposition.parts_rendered == 2
    assert exposition.render() == first  # nothing changed: cached bytes
    assert exposition.parts_rendered == 2
    pm.record(ok_run("a", 50.0))
    body = exposition.render()
    assert exposition.parts_rendered == 3  # only endpoint a again
    assert b'tokwatch_probe_decode_tokens_per_second{endpoint="a"' in body


def test_prerender_leaves_a_scrape_nothing_to_render() -> None:
    pm, exposition = probe_metrics()
    assert exposition.prerender() == 2  # both endpoints' parts, in the background
    assert exposition.prerender() == 0  # nothing changed since
    pm.record(ok_run("b", 20.0))
    assert exposition.prerender() == 1
    body = exposition.render()
    assert exposition.parts_rendered == 3  # the scrape rendered nothing itself
    assert samples(body) == samples(generate_latest(pm))  # type: ignore[arg-type]


def test_each_family_header_appears_once_and_removed_endpoints_vanish() -> None:
    pm, exposition = probe_metrics()
    pm.record(ok_run("a"))
    pm.record(ok_run("b"))
    body = exposition.render().decode()
    assert body.count("# TYPE tokwatch_probe_runs_total counter") == 1
    pm.set_endpoints([e for e in CONFIG.endpoints if e.name == "a"])
    body = exposition.render().decode()
    assert 'endpoint="b"' not in body and 'endpoint="a"' in body


def test_a_counter_and_a_gauge_with_one_base_name_are_both_served() -> None:
    class Both:
        def parts(self):  # type: ignore[no-untyped-def]
            return [("x", 1)]

        def collect_part(self, key):  # type: ignore[no-untyped-def]
            yield CounterMetricFamily("t_thing", "counter", value=3)
            yield GaugeMetricFamily("t_thing", "gauge", value=1)

        def collect(self):  # type: ignore[no-untyped-def]
            return list(self.collect_part("x"))

    exposition = Exposition()
    exposition.register(Both())  # type: ignore[arg-type]
    got = samples(exposition.render())
    assert ("t_thing_total", (), 3.0) in got and ("t_thing", (), 1.0) in got


def _joined(families: Families) -> bytes:
    return b"".join(families.headers.values()) + b"".join(families.samples.values())


def test_fast_formatting_is_byte_identical_to_prometheus_client_in_both_formats() -> None:
    pm, _ = probe_metrics()
    pm.record(ok_run("a", 50.0))
    for family in pm.collect():
        rendered = render_families([family])
        assert _joined(rendered["text"]) == generate_latest(_One(family))  # type: ignore[arg-type]
        reference = openmetrics.generate_latest(_One(family)).removesuffix(b"# EOF\n")  # type: ignore[arg-type]
        assert _joined(rendered["openmetrics"]) == reference


def test_families_the_fast_path_does_not_handle_fall_back_to_prometheus_client() -> None:
    info = InfoMetricFamily("t_build", "build", value={"version": 'a"b\\c'})
    rendered = render_families([info])
    assert _joined(rendered["text"]) == generate_latest(_One(info))  # type: ignore[arg-type]
    reference = openmetrics.generate_latest(_One(info)).removesuffix(b"# EOF\n")  # type: ignore[arg-type]
    assert _joined(rendered["openmetrics"]) == reference


def test_openmetrics_from_parts_has_the_samples_of_a_full_render_and_ends_with_eof() -> None:
    pm, exposition = probe_metrics()
    pm.record(ok_run("a", 50.0))
    pm.record(ok_run("b", 20.0))
    body = exposition.render("openmetrics")
    assert body.endswith(b"# EOF\n") and body.count(b"# EOF") == 1
    parsed = {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for fam in openmetrics_families(body.decode())
        for s in fam.samples
    }
    assert parsed == samples(exposition.render("text")) == samples(generate_latest(pm))  # type: ignore[arg-type]
    assert exposition.parts_rendered == 2  # both formats from one render per part


@pytest.mark.parametrize(
    ("accept", "fmt"),
    [
        # Prometheus 2.42 (the Debian package the tests run) and Prometheus 3's default scrape protocols
        (
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
            "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
            "openmetrics",
        ),
        (
            "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
            "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,"
            "text/plain;version=0.0.4;q=0.2,*/*;q=0.1",
            "openmetrics",
        ),
        ("application/openmetrics-text", "openmetrics"),
        ("text/plain;version=0.0.4;q=0.9,application/openmetrics-text;version=1.0.0;q=0.5", "text"),
        ("application/openmetrics-text;version=0.0.1", "text"),  # a version tokwatch does not serve
        ("application/openmetrics-text;version=1.0.0;q=0", "text"),
        ("application/json", "text"),
        ("", "text"),
        ("*/*", "text"),
    ],
)
def test_negotiation_follows_the_accept_header(accept: str, fmt: str) -> None:
    assert negotiate(accept) == fmt


def test_the_exposition_is_the_registry_queries_and_full_renders_read() -> None:
    """One registration serves /metrics, `generate_latest` and `get_sample_value` alike."""
    pm, exposition = probe_metrics()
    pm.record(ok_run("a", 50.0))
    labels = {"endpoint": "a", "gpu": "3090", "site": "", "workload": "seed000", "source": "engine"}
    assert exposition.get_sample_value("tokwatch_probe_decode_tokens_per_second", labels) == 50.0
    assert samples(exposition.render()) == samples(generate_latest(exposition))
    exposition.unregister(pm)
    assert exposition.render() == b"" and exposition.get_sample_value("tokwatch_endpoint_info") is None
