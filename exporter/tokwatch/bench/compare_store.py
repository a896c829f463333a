"""Runs for `tokwatch bench compare` from result directories or from the store of `--config tokwatch.yml`.

A run argument is read as:

- `store:ID`: a stored run, always (ID is a run id or a unique prefix of one);
- an existing directory: a result directory, even if a stored run id has the same spelling;
- anything else, with `--config`: a stored run id (`run_id` in summary.json) or a unique prefix of one.

The store is only read: compare never migrates. A database at an older schema is refused with the
`tokwatch db migrate` hint, and a missing SQLite file is reported, never created.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

from tokwatch.bench.compare import FIGURES, CompareError, Run, load_run
from tokwatch.bench.costing import headline_figures
from tokwatch.bench.load_shape import LoadShape, shape_of
from tokwatch.settings.config import Config, load_config
from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.storage.base import BenchStore, RunStore
from tokwatch.storage.bench_rows import BenchRequestRow, BenchRunRow, BenchSegmentRow
from tokwatch.storage.errors import StorageError
from tokwatch.storage.factory import bench_store, connect_store, resolve_dsn, sqlite_path

STORE_PREFIX = "store:"
# Stored from schema SQLite v5 / PostgreSQL v6 on; rows written before have NULL there.
LATER_FIGURES = ("tbt", "normalized_latency", "decode_tokens_per_s")
_SHOWN_CANDIDATES = 5


def stored_ref(arg: str, config: str | None) -> str | None:
    """The run id or prefix when `arg` names a stored run, None when it names a result directory."""
    if arg.startswith(STORE_PREFIX):
        ident = arg[len(STORE_PREFIX) :].strip()
        if not ident:
            raise CompareError(f"{arg!r}: give a stored run id (or a prefix of one) after {STORE_PREFIX}")
        if config is None:
            raise CompareError(
                f"{arg}: a stored run needs --config tokwatch.yml (the store bench runs went to)"
            )
        return ident
    if config is None or Path(arg).is_dir():
        return None
    return arg


def run_from_rows(run: BenchRunRow, requests: Sequence[BenchRequestRow]) -> Run:
    """The comparable figures of a stored run: its `ok` requests, in request-id order."""
    values: dict[str, list[list[float]]] = {f: [] for f in FIGURES}
    old_rows = False
    for r in sorted(requests, key=lambda r: r.request_id):
        if r.status != "ok":
            continue
        old_rows = old_rows or r.tbt_s is None  # stored before the migration: every row since has a list
        for figure, (key, is_list, _) in FIGURES.items():
            raw = getattr(r, key)
            if raw is None:
                continue
            values[figure].append([float(v) for v in raw] if is_list else [float(raw)])
    return Run(
        f"{STORE_PREFIX}{run.id}",
        values,
        run.generated_tokens_per_s,
        LATER_FIGURES if old_rows else (),
        _shape(run.summary),
        _cost_energy(run.summary),
    )


def _cost_energy(summary: str) -> dict[str, float]:
    """The stored run's cost and energy figures from its summary.json text (none when unreadable)."""
    try:
        doc = json.loads(summary)
    except (TypeError, json.JSONDecodeError):
        return {}
    return headline_figures(doc) if isinstance(doc, dict) else {}


def _shape(summary: str) -> LoadShape | None:
    """The stored run's load shape from its summary.json text (None when unreadable: noted, not fatal)."""
    try:
        doc = json.loads(summary)
    except (TypeError, json.JSONDecodeError):
        return None
    return shape_of(doc) if isinstance(doc, dict) else None


def _open_config(path: str) -> Config:
    try:
        config = load_config(path)
    except ConfigError as exc:
        raise CompareError(f"--config: {exc}") from None
    except OSError as exc:
        raise CompareError(f"--config {path}: {exc.strerror or exc}") from None
    if not config.storage.enabled:
        raise CompareError(f"{path}: storage.enabled is false, so there is no store to read runs from")
    if resolve_dsn(config.storage) is None and not sqlite_path(config.storage).is_file():
        raise CompareError(
            f"no store at {sqlite_path(config.storage)} (the SQLite file of {path}): no bench run was stored "
            f"there; `tokwatch bench --config {path}` stores runs"
        )
    return config


async def _check_schema(store: RunStore, config_path: str) -> None:
    """Refuse a database this tokwatch cannot read as it is; compare never migrates."""
    st = await store.schema_status()
    where = f"{store.backend} {store.location}"
    if st.too_new:
        raise CompareError(
            f"{where} has schema version {st.current}, newer than this tokwatch knows ({st.known}): "
            "upgrade tokwatch"
        )
    if st.current == 0:
        raise CompareError(f"{where} holds no tokwatch data: no bench run was stored there")
    if st.pending:
        raise CompareError(
            f"{where} has schema version {st.current}, older than this tokwatch's {st.known}: run "
            f"`tokwatch db migrate -c {config_path}` first (compare reads the store, it never migrates it)"
        )
    await store.ensure_ready()  # marks the store ready; cannot migrate (auto_migrate is off)


async def _resolve(bench: BenchStore, where: str, arg: str, ident: str, config_path: str) -> str:
    ids = await bench.bench_run_ids(ident, limit=_SHOWN_CANDIDATES + 1)
    if ident in ids:
        return ident
    if not ids:
        also = "" if arg.startswith(STORE_PREFIX) else f", and no result directory {arg}"
        raise CompareError(
            f"no stored bench run with id {ident!r} (or starting with it) in {where}{also}; "
            f"`tokwatch report --bench -c {config_path} --since 30d` lists stored runs"
        )
    if len(ids) > 1:
        shown = ", ".join(ids[:_SHOWN_CANDIDATES]) + (", ..." if len(ids) > _SHOWN_CANDIDATES else "")
        raise CompareError(f"run id prefix {ident!r} is ambiguous in {where}: {shown}; give more of the id")
    return ids[0]


async def _fetch(config: Config, config_path: str, wanted: Sequence[tuple[str, str]]) -> list[Run]:
    """The stored runs of (argument, id or prefix) pairs, read over one store connection."""
    store = await connect_store(config.storage, auto_migrate=False)
    try:
        await _check_schema(store, config_path)
        bench, where = bench_store(store), f"{store.backend} {store.location}"
        runs = []
        for arg, ident in wanted:
            got = await bench.bench_run(await _resolve(bench, where, arg, ident, config_path))
            if got is None:  # deleted between the two queries
                raise CompareError(f"stored bench run {ident!r} disappeared while being read")
            runs.append(run_from_rows(*got))
        return runs
    finally:
        await store.close()


def load_runs(args: Sequence[str], config: str | None) -> list[Run]:
    """One Run per argument, directories read from disk and stored runs from one store connection."""
    refs = [stored_ref(arg, config) for arg in args]
    stored: list[Run] = []
    wanted = [(arg, ref) for arg, ref in zip(args, refs, strict=True) if ref is not None]
    if wanted and config is not None:
        try:
            stored = asyncio.run(_fetch(_open_config(config), config, wanted))
        except StorageError as exc:  # messages are redacted by the store (no password)
            raise CompareError(str(exc)) from None
    found = iter(stored)
    return [load_run(arg) if ref is None else next(found) for arg, ref in zip(args, refs, strict=True)]


StoredRun = tuple[BenchRunRow, list[BenchSegmentRow], list[BenchRequestRow]]


async def _fetch_parts(config: Config, config_path: str, ident: str) -> StoredRun:
    store = await connect_store(config.storage, auto_migrate=False)
    try:
        await _check_schema(store, config_path)
        bench, where = bench_store(store), f"{store.backend} {store.location}"
        run_id = await _resolve(bench, where, f"{STORE_PREFIX}{ident}", ident, config_path)
        got = await bench.bench_run(run_id)
        if got is None:  # deleted between the two queries
            raise CompareError(f"stored bench run {ident!r} disappeared while being read")
        return got[0], await bench.bench_segments(run_id), got[1]
    finally:
        await store.close()


def read_stored_run(config_path: str, ident: str) -> StoredRun:
    """A stored run (id or unique prefix) with its segments and requests, from the store of a tokwatch.yml,
    read without migrating; raises CompareError naming the problem."""
    try:
        return asyncio.run(_fetch_parts(_open_config(config_path), config_path, ident))
    except StorageError as exc:  # messages are redacted by the store (no password)
        raise CompareError(str(exc)) from None
