"""Command-line values checked as the config file checks them, with one-line errors naming the flag.

Every subcommand's parser is a `OneLineErrorParser`, and every address or URL flag has one of these types,
so `serve --listen localhost` or `bench --url 127.0.0.1:8000` exit 2 with
`tokwatch serve: error: argument --listen: ...`, never a traceback.
"""

from __future__ import annotations

import argparse

from tokwatch.settings.one_line_parser import OneLineErrorParser
from tokwatch.settings.setting_values import check_http_url, parse_listen

__all__ = ["OneLineErrorParser", "http_url", "listen_address"]


def listen_address(value: str) -> str:
    """argparse type of HOST:PORT flags: the value, or what is wrong with it."""
    try:
        parse_listen(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def http_url(value: str) -> str:
    """argparse type of URL flags: an http:// or https:// URL with a host, or what is wrong with it."""
    try:
        return check_http_url(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
