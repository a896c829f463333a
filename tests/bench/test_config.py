import argparse

import pytest

from tokwatch.bench.commands import FLAGS, add_commands, options_from_args
from tokwatch.bench.config import BenchOptions
from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.transport import kernel_stamps


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def test_flags_become_options():
    opts = options_from_args(
        _parse(["--url", "http://127.0.0.1:1/v1", "--model", "m", "--rate", "5", "--arrivals", "gamma",
                "--burstiness", "0.5", "--duration", "30s", "--slo", "ttft:p99<=0.5",
                "--slo", "tbt:p90<=50ms", "--fluidity-decode-deadline", "20ms"])
    )  # fmt: skip
    assert (opts.rate, opts.arrivals, opts.burstiness, opts.duration) == (5.0, "gamma", 0.5, 30.0)
    assert opts.fluidity_decode_deadline == pytest.approx(0.02)
    assert [s.key for s in opts.parsed_slos()] == ["ttft_p99", "tbt_p90"]
    assert opts.effective_number is None  # bounded by duration only
    assert "open loop 5/s gamma" in opts.load_description()


def test_every_flag_of_the_table_reaches_its_option_and_no_other():
    """The parser and the copy into BenchOptions come from one table: a bench option names a field, a flag
    that is not one (compare's, the bench file, --no-store) names none."""
    fields = set(BenchOptions.model_fields)
    options = [f.option for f in FLAGS if f.option is not None]
    assert set(options) <= fields and len(options) == len(set(options))
    assert not {f.name for f in FLAGS if f.option is None} & fields
    given = options_from_args(
        _parse(["--url", "http://127.0.0.1:1/v1", "--model", "m", "--max-turns", "3", "--no-fixed-output",
                "--mirror-metric", "a", "--mirror-metric", "b"])
    )  # fmt: skip
    assert (given.max_turns, given.fixed_output, given.mirror_metrics) == (3, False, ("a", "b"))


def test_bench_file_with_seed_002_slos_and_flag_override(tmp_path):
    f = tmp_path / "bench.yml"
    f.write_text(
        "url: http://127.0.0.1:1/v1\nmodel: m\nconcurrency: 4\nnumber: 10\n"
        "slos:\n  - name: P99 TTFC\n    metric: ttfc\n    percentile: 0.99\n"
        "    value: 0.5\n    type: constant\n"
    )
    opts = options_from_args(_parse(["--bench-file", str(f), "--number", "3"]))
    assert opts.number == 3 and opts.concurrency == 4
    assert opts.parsed_slos()[0].metric == "ttft"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("url: http://x/v1\nmodel: m\nconcurrency: 0\n", r"bench.yml:3: concurrency: Input should be"),
        ("url: http://x/v1\nmodel: m\nbogus: 1\n", r"bench.yml:3: bogus: unknown option"),
        ("url: http://x/v1\nmodel: m\nrate: 1\nconcurrency: 2\n", r"either concurrency .* or rate"),
        ("url: http://x/v1\nmodel: m\nslos:\n  - metric: nope\n    percentile: 0.9\n    value: 1\n",
         r"bench.yml:4: slos\[0\]: unknown SLO metric 'nope'"),
        ("url: [\n", r"bench.yml:2: invalid YAML"),
        ("model: m\n", r"exactly one of endpoint .* or url"),
    ],
)  # fmt: skip
def test_bad_bench_files_name_file_line_and_field(tmp_path, text, message):
    f = tmp_path / "bench.yml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message):
        options_from_args(_parse(["--bench-file", str(f)]))


def test_receive_watcher_defaults_to_closed_loops_the_kernel_does_not_stamp():
    base = ["--url", "http://127.0.0.1:1/v1", "--model", "m"]
    closed = options_from_args(_parse([*base, "--concurrency", "8", "--number", "8"]))
    opened = options_from_args(_parse([*base, "--rate", "100", "--duration", "5s"]))
    assert closed.receive_watcher == "auto" and closed.kernel_stamped == kernel_stamps.available()
    assert closed.watch_receives == (not kernel_stamps.available())  # the kernel's stamps make it redundant
    closed_flags = [*base, "--concurrency", "8", "--number", "8"]
    unstamped = options_from_args(_parse([*closed_flags, "--kernel-stamps", "off"]))
    assert unstamped.watch_receives and not unstamped.kernel_stamped
    assert not opened.watch_receives
    opened_flags = [*base, "--rate", "100", "--duration", "5s"]
    forced = options_from_args(_parse([*opened_flags, "--receive-watcher", "on"]))
    assert forced.watch_receives
    closed_flags = [*base, "--concurrency", "8", "--number", "8"]
    off = options_from_args(_parse([*closed_flags, "--receive-watcher", "off"]))
    assert not off.watch_receives
    with pytest.raises(SystemExit):
        _parse([*base, "--receive-watcher", "sometimes"])


def test_dataset_flags_become_options(tmp_path):
    base = ["--url", "http://127.0.0.1:1/v1", "--model", "m"]
    opts = options_from_args(
        _parse([*base, "--dataset", "random-multi-turn", "--multi-turn", "--min-turns", "2",
                "--max-turns", "5", "--dataset-offset", "7", "--tokenizer", "/models/tokenizer.json",
                "--extra-body", '{"top_k": 20, "chat_template_kwargs": {"enable_thinking": false}}'])
    )  # fmt: skip
    assert (opts.min_turns, opts.max_turns, opts.dataset_offset) == (2, 5, 7)
    assert opts.tokenizer == "/models/tokenizer.json"
    assert opts.extra_body == {"top_k": 20, "chat_template_kwargs": {"enable_thinking": False}}
    f = tmp_path / "bench.yml"
    f.write_text("url: http://x/v1\nmodel: m\nextra_body:\n  top_k: 5\ndataset_offset: 2\nmin_turns: 1\n")
    from_file = options_from_args(_parse(["--bench-file", str(f)]))
    assert from_file.extra_body == {"top_k": 5} and from_file.dataset_offset == 2


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--extra-body", "{top_k: 1}"], r"command line: extra_body: .*invalid JSON"),
        (["--extra-body", "[1, 2]"], r"extra_body: .*must be a JSON object"),
        (["--dataset", "random-multi-turn", "--multi-turn"], r"random-multi-turn needs max_turns"),
        (["--dataset", "random-multi-turn", "--max-turns", "3"], r"random-multi-turn needs multi_turn"),
        (["--min-turns", "4", "--max-turns", "3"], r"min_turns 4 is above max_turns 3"),
        (["--dataset-offset", "-1"], r"dataset_offset: Input should be greater than or equal to 0"),
    ],
)
def test_bad_dataset_flags_are_usage_errors(flags, message):
    with pytest.raises(ConfigError, match=message):
        options_from_args(_parse(["--url", "http://127.0.0.1:1/v1", "--model", "m", *flags]))


def test_receive_watcher_auto_leaves_a_single_stream_on_its_loop():
    base = ["--url", "http://127.0.0.1:1/v1", "--model", "m", "--number", "4", "--kernel-stamps", "off"]
    assert not options_from_args(_parse([*base, "--concurrency", "1"])).watch_receives
    assert options_from_args(_parse([*base, "--concurrency", "2"])).watch_receives
    assert options_from_args(_parse([*base, "--concurrency", "1", "--receive-watcher", "on"])).watch_receives


def test_kernel_stamps_are_on_unless_turned_off(capsys):
    base = ["--url", "http://127.0.0.1:1/v1", "--model", "m", "--number", "4"]
    assert options_from_args(_parse(base)).kernel_stamps == "on"
    assert options_from_args(_parse([*base, "--kernel-stamps", "off"])).kernel_stamps == "off"
    with pytest.raises(SystemExit):
        _parse([*base, "--kernel-stamps", "maybe"])
    assert "--kernel-stamps: invalid choice: 'maybe'" in capsys.readouterr().err
