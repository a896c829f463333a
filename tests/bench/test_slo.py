import pytest

from tokwatch.bench.outcome import BenchOutcome, ExitCode
from tokwatch.bench.slo import SloError, evaluate, goodput, parse_slo, slo_from_mapping
from tokwatch.figures.result import Status


def test_parse_cli_specs():
    s = parse_slo("ttft:p99<=0.5")
    assert (s.metric, s.percentile, s.value, s.op, s.key) == ("ttft", 0.99, 0.5, "<=", "ttft_p99")
    s = parse_slo("tbt:p90<=50ms")
    assert s.value == pytest.approx(0.05)
    assert parse_slo("tbc:p50<0.1").metric == "tbt"  # Veeksha's name
    f = parse_slo("fluidity_index:p10>=0.9")
    assert not f.lower_is_better


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ttft<=0.5", "expected METRIC:pNN<=VALUE"),
        ("latency:p99<=1", "unknown SLO metric 'latency'"),
        ("ttft:p0<=1", "percentile must be in"),
        ("ttft:p99<=abc", "expected METRIC"),
    ],
)
def test_bad_cli_specs_name_the_problem(spec, message):
    with pytest.raises(SloError, match=message):
        parse_slo(spec)


def test_seed_002_yaml_entries():
    s = slo_from_mapping(
        {
            "name": "P99 TTFC under 500ms",
            "metric": "ttfc",
            "percentile": 0.99,
            "value": 0.5,
            "type": "constant",
        },
        "slos[0]",
    )
    assert (s.name, s.metric, s.percentile, s.value, s.op) == (
        "P99 TTFC under 500ms",
        "ttft",
        0.99,
        0.5,
        "<=",
    )
    with pytest.raises(SloError, match=r"slos\[1\]: SLO is missing 'value'"):
        slo_from_mapping({"metric": "tbt", "percentile": 0.9}, "slos[1]")
    with pytest.raises(SloError, match="fraction"):
        slo_from_mapping({"metric": "tbt", "percentile": 90, "value": 1}, "slos[2]")
    with pytest.raises(SloError, match="type 'linear'"):
        slo_from_mapping({"metric": "tbt", "percentile": 0.9, "value": 1, "type": "linear"}, "slos[3]")


def test_evaluate_shape_and_observed_values(make_record):
    records = [make_record(i, ttft=0.1 * (i + 1)) for i in range(10)]  # ttft 0.1 .. 1.0
    slos = [parse_slo("ttft:p50<=0.6"), parse_slo("ttft:p99<=0.5"), parse_slo("tbt:p90<=20ms")]
    out = evaluate(slos, records)
    assert out["all_slos_met"] is False
    r0, r1, r2 = out["results"]
    assert r0["observed_value"] == pytest.approx(0.55) and r0["met"] is True
    assert r1["observed_value"] == pytest.approx(0.991) and r1["met"] is False
    assert r2["met"] is True and r2["slo_metric_key"] == "tbt_p90" and r2["lower_is_better"] is True


def test_goodput_counts_errored_requests_in_the_denominator(make_record):
    records = [make_record(i, ttft=0.2 if i < 6 else 0.8) for i in range(8)]
    records += [make_record(8, status=Status.PROVIDER_ERROR), make_record(9, status=Status.TIMEOUT)]
    g = goodput([parse_slo("ttft:p99<=0.5")], records, wall_s=10.0)
    assert g == {
        "good_requests": 6,
        "measured_requests": 10,
        "goodput_ratio": 0.6,
        "goodput_requests_per_s": 0.6,
    }


def test_warmup_requests_are_excluded(make_record):
    records = [make_record(0, ttft=5.0, warmup=True), make_record(1, ttft=0.1)]
    out = evaluate([parse_slo("ttft:p99<=0.5")], records)
    assert out["all_slos_met"] is True
    assert out["results"][0]["samples"] == 1


def _outcome(records, slos, complete=True):
    return BenchOutcome(
        options={},
        records=records,
        started_at_unix=0,
        wall_s=10,
        complete=complete,
        stop_reason="x",
        slos=slos,
    )


def test_exit_codes(make_record):
    ok = [make_record(i, ttft=0.1) for i in range(3)]
    assert _outcome(ok, [parse_slo("ttft:p99<=0.5")]).exit_code() is ExitCode.OK
    assert _outcome(ok, []).exit_code() is ExitCode.OK
    assert _outcome(ok, [parse_slo("ttft:p99<=0.05")]).exit_code() is ExitCode.SLO_FAILED
    assert _outcome(ok, [], complete=False).exit_code() is ExitCode.INCOMPLETE
    failed = [make_record(i, status=Status.UNREACHABLE) for i in range(3)]
    assert _outcome(failed, []).exit_code() is ExitCode.FAILED
    assert len({c.value for c in ExitCode}) == len(ExitCode)
