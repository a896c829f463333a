"""Logs fit for a fleet: --log-format/--log-level anywhere on the command line, JSON lines with structured
fields and secrets masked in both formats, one summary line per round instead of one line per run."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli_processes import read_lines_until
from tokwatch.cli import build_parser, setup_logging
from tokwatch.figures.result import RunResult, Status, TimingSource
from tokwatch.logs.round_log import RoundTally
from tokwatch.settings.redact import Redactor

SECRET = "sk-live-Abcdef123456"


@pytest.mark.parametrize(
    "argv",
    [
        ["--log-format", "json", "--log-level", "debug", "check-config", "x.yml"],
        ["check-config", "x.yml", "--log-format", "json", "--log-level", "debug"],
        ["--log-level", "warning", "check-config", "--log-format=json", "x.yml", "--log-level=debug"],
        ["db", "--log-format", "json", "migrate", "--config", "x.yml", "--log-level", "debug"],
    ],
    ids=["before", "after", "both (the later wins)", "nested subcommand"],
)
def test_logging_flags_anywhere_on_the_command_line(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.log_format, args.log_level) == ("json", "debug")


def test_logging_flags_default_to_text_at_info() -> None:
    args = build_parser().parse_args(["check-config", "x.yml"])
    assert (args.log_format, args.log_level) == ("text", "info")


def test_a_bad_log_format_is_a_one_line_usage_error(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tokwatch", "check-config", "x.yml", "--log-format", "yaml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert out.returncode == 2
    assert "--log-format" in out.stderr and "yaml" in out.stderr and "Traceback" not in out.stderr


@pytest.fixture
def restore_logging() -> object:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("restore_logging")
def test_json_lines_carry_fields_and_mask_secrets(capsys: pytest.CaptureFixture[str]) -> None:
    redacting = setup_logging("info", "json")
    redacting.follow(lambda: Redactor([SECRET]))
    log = logging.getLogger("tokwatch.test")
    log.info("round %d: key %s", 3, SECRET, extra={"round": 3, "endpoint_key": SECRET})
    try:
        raise ValueError(f"bad key {SECRET}")
    except ValueError:
        log.exception("probe crashed")
    log.debug("not at info")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert len(lines) == 2
    first, second = lines
    assert set(first) == {"time", "level", "logger", "message", "round", "endpoint_key"}
    assert first["time"].endswith("Z") and first["level"] == "info" and first["logger"] == "tokwatch.test"
    assert first["message"] == "round 3: key ***" and first["round"] == 3 and first["endpoint_key"] == "***"
    assert second["level"] == "error" and "ValueError: bad key ***" in second["exception"]
    assert SECRET not in json.dumps(lines)


@pytest.mark.usefixtures("restore_logging")
def test_text_lines_mask_secrets_in_tracebacks(capsys: pytest.CaptureFixture[str]) -> None:
    redacting = setup_logging("info", "text")
    redacting.follow(lambda: Redactor([SECRET]))
    try:
        raise ValueError(f"bad key {SECRET}")
    except ValueError:
        logging.getLogger("tokwatch").exception("probe crashed with %s", SECRET)
    err = capsys.readouterr().err
    assert " ERROR tokwatch: probe crashed with ***" in err and "ValueError: bad key ***" in err
    assert SECRET not in err


def _run(endpoint: str, workload: str = "seed000", **kw: object) -> RunResult:
    fields: dict[str, object] = {
        "status": Status.OK,
        "tokens_per_second": 50.0,
        "source": TimingSource.ENGINE,
    }
    fields.update(kw)
    return RunResult(endpoint=endpoint, workload=workload, started_at=1.0, **fields)  # type: ignore[arg-type]


def test_a_round_logs_one_summary_line_per_kind(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tokwatch")
    tally = RoundTally()
    disturbed = {"timing_disturbed": True, "max_stall_s": 0.2}
    tally.add(_run("a", **disturbed, set_aside={"ttft": "client_stall", "itl": "client_stall"}))
    tally.add(_run("a", "long", **disturbed, set_aside={"tokens_per_second": "client_stall"}))
    tally.add(_run("b", **disturbed, set_aside={"ttft": "client_stall"}))
    tally.add(_run("c"))
    for i in range(7):
        tally.add(_run(f"down{i}", status=Status.TIMEOUT, error_class="read_timeout"))
    tally.flush(12)
    assert caplog.messages == [
        "round 12: 7 of 11 runs not ok: down0: timeout (read_timeout), down1: timeout (read_timeout), "
        "down2: timeout (read_timeout), down3: timeout (read_timeout), down4: timeout (read_timeout) "
        "and 2 more",
        "round 12: 4 figures set aside on 2 endpoints (client timing disturbed)",
    ]
    assert caplog.records[1].figures_set_aside == 4  # type: ignore[attr-defined]
    caplog.clear()
    tally.add(_run("c"))
    tally.flush(13)  # a round with nothing to say says nothing
    assert caplog.messages == []


def test_per_run_lines_only_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="tokwatch")
    tally = RoundTally()
    tally.add(_run("a", timing_disturbed=True, set_aside={"ttft": "client_stall"}, max_stall_s=0.01))
    tally.add(_run("b", status=Status.TIMEOUT, error_class="read_timeout"))
    per_run = [r for r in caplog.records if r.getMessage().startswith("endpoint ")]
    assert [r.getMessage().split(":")[0] for r in per_run] == ["endpoint a", "endpoint b"]
    assert {r.levelno for r in per_run} == {logging.DEBUG}


def test_serve_logs_json_lines_one_summary_per_round(tmp_path: Path, free_port: Callable[[], int]) -> None:
    """A real `tokwatch serve` with an unreachable endpoint, `--log-format json` after the subcommand."""
    config = tmp_path / "tokwatch.yml"
    config.write_text(f"""
schedule: {{interval: 1h, run_on_start: true}}
storage: {{enabled: false}}
endpoints:
  - {{name: gone, kind: openai, base_url: 'http://127.0.0.1:1/v1', model: m, api_key: {SECRET}}}
""")
    argv = [
        sys.executable,
        "-m",
        "tokwatch",
        "serve",
        "-c",
        str(config),
        "--listen",
        f"127.0.0.1:{free_port()}",
    ]
    proc = subprocess.Popen([*argv, "--log-format", "json"], stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert proc.stderr is not None
        texts = read_lines_until(proc.stderr, lambda seen: any("runs_not_ok" in t for t in seen), 60)
        lines: list[dict[str, object]] = [json.loads(t) for t in texts]  # every line is one JSON object
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    summary = [line for line in lines if "runs_not_ok" in line]
    assert len(summary) == 1, lines
    assert (
        summary[0]["round"] == 1 and summary[0]["runs"] == 1 and summary[0]["statuses"] == {"unreachable": 1}
    )
    assert str(summary[0]["message"]).startswith("round 1: 1 of 1 runs not ok: gone: unreachable")
    assert not [line for line in lines if str(line["message"]).startswith("endpoint gone:")]  # per run: debug
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    assert SECRET not in json.dumps(lines)
