"""Command line: `tokwatch serve|probe|check-config|sim|demo|db|report|bench`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from tokwatch import __version__
from tokwatch.bench.commands import add_commands as bench_commands
from tokwatch.commands.demo import add_commands as demo_commands
from tokwatch.commands.healthcheck import add_commands as healthcheck_commands
from tokwatch.commands.launch import add_web_config_option, print_results, start_exporter, until_signal
from tokwatch.commands.store_commands import add_commands as storage_commands
from tokwatch.figures.result import RunResult
from tokwatch.figures.series import run_name
from tokwatch.figures.wording import counted
from tokwatch.logs.log_format import LOG_FORMATS, LogFormat, formatter, structured_fields
from tokwatch.logs.log_throttle import RepeatThrottle
from tokwatch.probes.keys import Keys
from tokwatch.service.app import App
from tokwatch.service.price_sources import PriceSources
from tokwatch.service.probe_service import prompt_sizers
from tokwatch.service.shard import Shard, ShardError, parse_shard, shard_from_env
from tokwatch.settings.argtypes import OneLineErrorParser, listen_address
from tokwatch.settings.config import DEFAULT_LISTEN, Config, load_config
from tokwatch.settings.redact import Redactor
from tokwatch.settings.setting_values import parse_listen
from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.settings.webconfig import WebConfig, load_web_config
from tokwatch.storage.errors import StorageError
from tokwatch.storage.factory import resolve_dsn

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
log = logging.getLogger("tokwatch")


class RedactingFilter(logging.Filter):
    """Last line of defence: masks known secrets and credential-shaped text in every log record."""

    def __init__(self) -> None:
        super().__init__()
        self._source: Callable[[], Redactor] = Redactor

    def follow(self, source: Callable[[], Redactor]) -> None:
        """Mask what `source()` knows at each record, e.g. the running app's keys, which a reload changes."""
        self._source = source

    def filter(self, record: logging.LogRecord) -> bool:
        redact = self._source()
        record.msg = redact(record.getMessage())
        record.args = None
        # The structured fields (JSON lines) and a traceback's text can carry a secret as well.
        for key, value in structured_fields(record).items():
            if isinstance(value, str):
                setattr(record, key, redact(value))
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def setup_logging(level: str, fmt: LogFormat = "text") -> RedactingFilter:
    """Log to stderr as text lines with timestamps or as JSON lines; repeated warnings throttled; every
    record goes through the returned redacting filter."""
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(fmt))
    redacting = RedactingFilter()
    handler.addFilter(RepeatThrottle())
    handler.addFilter(redacting)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    return redacting


def _listen(args: argparse.Namespace, config: Config | None) -> tuple[str, int]:
    return parse_listen(args.listen or (config.listen if config else DEFAULT_LISTEN))


# --- serve ---------------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the exporter until SIGTERM/SIGINT; SIGHUP reloads the config."""
    config = load_config(args.config)
    host, port = _listen(args, config)
    try:
        shard = parse_shard(args.shard) if args.shard else shard_from_env()
    except ShardError as exc:
        print(f"tokwatch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    web_config = load_web_config(args.web_config) if args.web_config else None
    return asyncio.run(_serve(config, args.config, host, port, args.log_filter, shard, web_config))


async def _serve(
    config: Config,
    path: str,
    host: str,
    port: int,
    redacting: RedactingFilter,
    shard: Shard | None = None,
    web_config: tuple[WebConfig, Path] | None = None,
) -> int:
    app = App(config, path, shard=shard)
    if app.shard.count > 1:
        log.info(
            "shard %s: probing %d of the fleet's %s",
            app.shard.label,
            len(app.config.endpoints),
            counted(len(config.endpoints), "endpoint"),
        )
        if resolve_dsn(config.storage) is None:
            log.warning(
                "shard %s without a shared PostgreSQL (storage.dsn or TOKWATCH_DSN): fleet figures cover "
                "this replica's endpoints only",
                app.shard.label,
            )
    redacting.follow(lambda: app.keys.redactor)
    started = await start_exporter(app, host, port, web_config)
    if started is None:
        return EXIT_USAGE
    runner, bound = started
    tls = web_config is not None and web_config[0].tls_server_config is not None
    log.info(
        "tokwatch %s listening on %s://%s:%d/metrics (%s)",
        __version__,
        "https" if tls else "http",
        host,
        bound,
        counted(len(config.endpoints), "endpoint"),
    )
    try:
        await until_signal(on_hup=lambda: asyncio.ensure_future(app.reload()))
    finally:
        log.info("shutting down: cancelling probes in flight")
        await app.stop()
        await runner.cleanup()
    return EXIT_OK


# --- probe ---------------------------------------------------------------------------------------------


def cmd_probe(args: argparse.Namespace) -> int:
    """Probe endpoints once (each of their workloads), print a table, exit 1 if any run was not ok."""
    config = load_config(args.config)
    names = args.endpoints or [e.name for e in config.enabled_endpoints]
    unknown = [n for n in names if config.endpoint(n) is None]
    if unknown:
        print(f"tokwatch: {args.config}: no endpoint named {', '.join(unknown)}", file=sys.stderr)
        return EXIT_USAGE
    if not names:
        print(f"tokwatch: {args.config}: no enabled endpoints to probe", file=sys.stderr)
        return EXIT_USAGE
    # Only the named endpoints: their keys, their servers' counters; nothing else is touched.
    only = config.model_copy(update={"endpoints": tuple(e for e in config.endpoints if e.name in names)})
    results = asyncio.run(_probe_once(only, args.config, names, args.log_filter))
    print_results(results)
    for r in results:
        if not r.ok:
            detail = f" ({r.error_class})" if r.error_class else ""
            message = f": {r.error_message}" if r.error_message else ""  # redacted by the probe
            print(f"{run_name(r.endpoint, r.workload)}: {r.status.value}{detail}{message}")
    return EXIT_OK if all(r.ok for r in results) else EXIT_FAILED


async def _probe_once(
    config: Config, path: str, names: Sequence[str], redacting: RedactingFilter
) -> list[RunResult]:
    app = App(config, path)
    redacting.follow(lambda: app.keys.redactor)
    await app.start(schedule=False, storage=False)  # a one-off check, not part of the stored history
    try:
        results = []
        for name in names:
            ep, _ = app.probes.target(name)
            for w in config.workloads_for(ep):
                results.append((await app.probe(name, workload=w.name)).result)
        return results
    finally:
        await app.stop()


# --- check-config --------------------------------------------------------------------------------------


def cmd_check_config(args: argparse.Namespace) -> int:
    """Validate a config file; exit 0 if valid, 2 with file:line: field: message lines if not."""
    config = load_config(args.file)
    Keys(config)  # env vars and key files must resolve too
    prompt_sizers(config)  # and endpoints' tokenizer.json files load
    PriceSources().load(config.pricing)  # and the price table and OpenRouter list files read
    endpoints = counted(len(config.endpoints), "endpoint")
    print(f"{args.file}: ok ({endpoints}, {len(config.enabled_endpoints)} enabled)")
    return EXIT_OK


# --- parser --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = OneLineErrorParser(prog="tokwatch", description=__doc__)
    parser.add_argument("--version", action="version", version=f"tokwatch {__version__}")
    _logging_options(parser, defaults=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("serve", help="run the exporter (scheduled probes, /metrics, /probe)")
    p.add_argument("--config", "-c", required=True, help="tokwatch.yml")
    p.add_argument(
        "--listen",
        type=listen_address,
        help=f"HOST:PORT to serve on (default from config, else {DEFAULT_LISTEN})",
    )
    p.add_argument(
        "--shard",
        metavar="I/N",
        help="probe replica I's share (0-based) of N replicas' endpoints; default from TOKWATCH_SHARD, "
        "or TOKWATCH_SHARD_INDEX (a number or a StatefulSet pod name) with TOKWATCH_SHARD_COUNT",
    )
    add_web_config_option(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("probe", help="probe endpoints once and print a table; exit 1 if any run was not ok")
    p.add_argument("--config", "-c", required=True)
    p.add_argument("endpoints", nargs="*", metavar="ENDPOINT")
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("check-config", help="validate a config file")
    p.add_argument("file")
    p.set_defaults(func=cmd_check_config)

    for register in (demo_commands, storage_commands, bench_commands, healthcheck_commands):
        register(sub)
    for command in _subcommand_parsers(parser):
        _logging_options(command, defaults=False)
    return parser


def unknown_top_level_flag(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """The first flag before the command that the top-level parser does not know (argparse would take the
    command for its value and say only that COMMAND is missing), or None."""
    known = parser._option_string_actions
    commands = {c for a in parser._actions if isinstance(a, argparse._SubParsersAction) for c in a.choices}
    skip = False
    for token in argv:
        if skip:
            skip = False
        elif token in commands or token == "--":
            return None
        elif token.startswith("-"):
            name = token.split("=", 1)[0]
            action = known.get(name)
            if action is None:
                return name
            skip = "=" not in token and action.nargs != 0
    return None


LOG_LEVELS = ("debug", "info", "warning", "error")


def _logging_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """--log-level and --log-format, before or after the subcommand: the top-level parser sets the
    defaults, each subcommand's takes the flags without a default (one given after it wins)."""
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="info" if defaults else argparse.SUPPRESS,
        help="least severe level logged (default info; debug adds a line per run)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text" if defaults else argparse.SUPPRESS,
        help="text lines (default) or JSON lines: time, level, logger, message and structured fields",
    )


def _subcommand_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every subcommand's parser under `parser`, nested ones included (`tokwatch bench run`)."""
    out: list[argparse.ArgumentParser] = []
    for action in parser._actions:  # argparse keeps subcommands only there
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # aliases share one parser
                out.append(child)
                out.extend(_subcommand_parsers(child))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (config errors: 2, never a traceback)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    unknown = unknown_top_level_flag(parser, argv)
    if unknown is not None:
        parser.error(f"unknown option {unknown} before the command")
    args = parser.parse_args(argv)
    args.log_filter = setup_logging(args.log_level, args.log_format)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"tokwatch: configuration error:\n{exc}", file=sys.stderr)
        return EXIT_USAGE
    except StorageError as exc:
        print(f"tokwatch: storage: {Redactor()(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
