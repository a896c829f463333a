"""Address and URL flags of every subcommand: a mistake is one line on stderr naming the flag, exit 2."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli_processes import stop, tokwatch, wait_http
from tokwatch.cli import build_parser
from tokwatch.settings.argtypes import http_url, listen_address

ROOT = Path(__file__).resolve().parents[1]
SIM = str(ROOT / "examples" / "sim.yml")
CONFIG = str(ROOT / "examples" / "tokwatch.yml")
BENCH = ["bench", "--model", "m", "--number", "1"]


def _options(parser: argparse.ArgumentParser, path: str = "tokwatch") -> Iterator[tuple[str, Any]]:
    """(subcommand path, action) of every option of every (sub)parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{path} {name}")
        elif action.option_strings:
            yield path, action


def test_every_address_and_url_flag_is_validated() -> None:
    """A new --listen or --...-url flag without its type fails here, before a user meets a traceback."""
    found = {
        (path, action.option_strings[0]): action.type
        for path, action in _options(build_parser())
        if "listen" in action.dest or "url" in action.dest
    }
    # healthcheck checks its --url itself and exits 1 with one line: exit 2 is reserved by Docker's
    # HEALTHCHECK, so argparse must not reject it (tests/commands/test_healthcheck.py covers its messages).
    own_check = {("tokwatch healthcheck", "--url")}
    assert {k for k, v in found.items() if v not in (listen_address, http_url)} == own_check
    assert ("tokwatch serve", "--listen") in found and ("tokwatch bench", "--url") in found
    assert ("tokwatch sim", "--listen") in found and ("tokwatch demo", "--listen") in found
    assert ("tokwatch bench", "--metrics-url") in found and ("tokwatch bench", "--listen") in found


@pytest.mark.parametrize(
    ("argv", "flag", "says"),
    [
        (["serve", "-c", CONFIG, "--listen", "localhost"], "--listen", "must be HOST:PORT"),
        (["serve", "-c", CONFIG, "--listen", "127.0.0.1:http"], "--listen", "port 'http' is not a number"),
        (["demo", "--listen", "9477"], "--listen", "must be HOST:PORT"),
        (["sim", "-c", SIM, "--listen", "127.0.0.1:99999"], "--listen", "port 99999 is out of range"),
        ([*BENCH, "--url", "http://127.0.0.1:9/v1", "--listen", "x"], "--listen", "must be HOST:PORT"),
        ([*BENCH, "--url", "127.0.0.1:28900"], "--url", "did you mean http://127.0.0.1:28900?"),
        ([*BENCH, "--url", "http://127.0.0.1:70000/v1"], "--url", "the port is not a number in 0-65535"),
        (
            [*BENCH, "--url", "http://127.0.0.1:9/v1", "--metrics-url", "1.2.3.4/metrics"],
            "--metrics-url",
            "http://",
        ),
    ],
)
def test_a_bad_address_is_one_line_naming_the_flag(argv: list[str], flag: str, says: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tokwatch", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT / "exporter")},
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"argument {flag}:" in lines[0] and says in lines[0] and "Traceback" not in proc.stderr


def test_a_bench_file_url_without_a_scheme_names_the_file_and_option(tmp_path: Path) -> None:
    from tokwatch.bench.config import build_options
    from tokwatch.settings.strict_yaml import ConfigError

    with pytest.raises(ConfigError, match="url: must be an http:// or https:// URL"):
        build_options({"url": "127.0.0.1:28900", "model": "m"}, source="bench.yml")


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tokwatch", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT / "exporter")},
    )


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--bogus", "serve", "-c", CONFIG], "--bogus"),
        (["--log-level", "debug", "--verbose=2", "check-config", CONFIG], "--verbose"),
    ],
)
def test_an_unknown_top_level_flag_is_named(argv: list[str], flag: str) -> None:
    """argparse alone took the command for the unknown flag's value and said only that COMMAND was missing."""
    proc = _run(*argv)
    assert proc.returncode == 2
    assert proc.stderr == f"tokwatch: error: unknown option {flag} before the command (see tokwatch --help)\n"


def test_known_top_level_flags_and_their_values_pass() -> None:
    proc = _run("--log-level", "warning", "check-config", CONFIG)
    assert proc.returncode == 0 and proc.stdout.startswith(f"{CONFIG}: ok ("), proc.stderr


def test_an_empty_config_warns_in_one_line_and_still_starts(
    tmp_path: Path, free_port: Callable[[], int]
) -> None:
    empty = tmp_path / "tokwatch.yml"
    empty.write_text("# nothing configured yet\n")
    proc = _run("check-config", str(empty))
    assert proc.returncode == 0 and proc.stdout == f"{empty}: ok (0 endpoints, 0 enabled)\n"
    warnings = [line for line in proc.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and warnings[0].endswith(
        f"{empty}: the file is empty: running on the defaults with no endpoints"
    )
    port = free_port()
    server = tokwatch("serve", "-c", str(empty), "--listen", f"127.0.0.1:{port}")
    try:
        wait_http(f"http://127.0.0.1:{port}/-/healthy")
    finally:
        code, _, err = stop(server)
    assert code == 0 and "the file is empty" in err and "(0 endpoints)" in err, err


def test_one_endpoint_is_not_one_endpoints(tmp_path: Path) -> None:
    one = tmp_path / "one.yml"
    one.write_text("endpoints:\n  - {name: a, kind: openai, base_url: 'http://127.0.0.1:9/v1', model: m}\n")
    proc = _run("check-config", str(one))
    assert proc.stdout == f"{one}: ok (1 endpoint, 1 enabled)\n", proc.stderr
