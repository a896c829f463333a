"""Parsing /metrics bodies: real captures, OpenMetrics, and every kind of bad input."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from tokwatch.counters.parse import (
    MetricsParseError,
    _parse_reference,
    _parse_text_fast,
    is_openmetrics,
    parse_metrics,
)


def test_real_vllm_capture_keeps_full_sample_names(sample_text: Callable[[str], str]) -> None:
    snap = parse_metrics(sample_text("vllm_metrics.txt"))
    # The text parser strips `_total` from the family name; samples keep it.
    assert snap.has("vllm:generation_tokens_total")
    assert snap.kind_of("vllm:generation_tokens_total") == "counter"
    assert snap.has("vllm:request_decode_time_seconds_sum")
    assert snap.has("vllm:generation_tokens_created")
    assert snap.total("vllm:request_success_total") == 0.0
    assert len(snap.select("vllm:request_success_total")) == 3  # stop, length, abort
    assert snap.label_values("model_name", "vllm:") == {"Qwen/Qwen1.5-0.5B-Chat"}


def test_label_filter_and_sum() -> None:
    snap = parse_metrics('a_total{x="1",y="p"} 2\na_total{x="2",y="p"} 3\na_total{x="2",y="q"} 5\n')
    assert snap.total("a_total") == 10
    assert snap.total("a_total", {"x": "2"}) == 8
    assert snap.total("a_total", {"x": "3"}) is None
    assert snap.mean("a_total", {"y": "p"}) == 2.5


def test_openmetrics_is_detected_and_parsed() -> None:
    text = "# TYPE a counter\na_total 3\na_created 1.5\n# TYPE g gauge\ng 2\n# EOF\n"
    assert is_openmetrics(text)
    snap = parse_metrics(text)
    assert snap.total("a_total") == 3
    assert snap.total("a_created") == 1.5
    assert snap.kind_of("a_total") == "counter"
    assert is_openmetrics("g 1\n", "application/openmetrics-text; version=1.0.0")


def test_nan_and_inf_samples_are_dropped() -> None:
    snap = parse_metrics("a NaN\nb +Inf\nc 1\n")
    assert not snap.has("a") and not snap.has("b")
    assert snap.total("c") == 1


@pytest.mark.parametrize(
    "text",
    [
        'vllm:generation_tokens_total{engine="0" 12\n',  # unterminated label set
        "vllm:generation_tokens_total{engine=",  # truncated mid-line
        "foo abc\n",  # not a number
        "# TYPE a counter\na_total 1\n",  # OpenMetrics (by content type) without # EOF
    ],
)
def test_malformed_text_raises_a_parse_error_not_a_traceback(text: str) -> None:
    content_type = "application/openmetrics-text" if "TYPE a counter" in text else None
    with pytest.raises(MetricsParseError, match="invalid exposition text"):
        parse_metrics(text, content_type=content_type)


def test_caps_on_size_and_sample_count() -> None:
    with pytest.raises(MetricsParseError, match="exceeds the 100 cap"):
        parse_metrics("a 1\n" * 50, max_chars=100)
    with pytest.raises(MetricsParseError, match="more than 10 samples"):
        parse_metrics("".join(f'a{{i="{i}"}} 1\n' for i in range(20)), max_samples=10)


def test_empty_body_is_an_empty_snapshot() -> None:
    snap = parse_metrics("")
    assert list(snap.names()) == []
    assert snap.total("anything") is None
    assert not math.isnan(parse_metrics("x 0\n").total("x") or 0.0)


TRICKY = [
    '# TYPE a counter\na{x="q\\"uote",y="back\\\\slash",z="new\\nline"} 1\n',
    "# TYPE h histogram\nh_bucket{le=\"0.1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.3\nh_count 2\n"
    "h_created 5\n",
    "# TYPE s summary\ns{quantile=\"0.5\"} 1\ns_sum 2\ns_count 3\n",
    "# TYPE c counter\nc 7\nuntyped_thing 3 1700000000000\n",
    'g{a="1",} 2\ng{ a = "2" } -3.5e-2\n',
    "# HELP x some help\n# TYPE x gauge\nx NaN\nx{l=\"v\"} +Inf\ny 4\n",
    "odd line that is not a sample\n",
]


@pytest.mark.parametrize(
    "name", ["vllm_metrics.txt", "llamacpp_metrics_after.txt", "llamacpp_metrics_legacy.txt"]
)
def test_fast_text_parser_matches_prometheus_client_on_captures(
    name: str, sample_text: Callable[[str], str]
) -> None:
    _same_as_reference(sample_text(name))


@pytest.mark.parametrize("text", TRICKY)
def test_fast_text_parser_matches_prometheus_client_on_edge_cases(text: str) -> None:
    _same_as_reference(text)


def _same_as_reference(text: str) -> None:
    try:
        reference = _parse_reference(text, False, 10**6)
    except MetricsParseError:
        with pytest.raises(MetricsParseError):
            parse_metrics(text)
        return
    fast = _parse_text_fast(text, 10**6)
    got = fast if fast is not None else parse_metrics(text)
    assert dict(got.series) == dict(reference.series)
    assert dict(got.types) == dict(reference.types)
