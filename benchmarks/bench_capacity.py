"""The capacity ladder: how fast can one `tokwatch bench` process send, and how clean do its figures stay?

Every rung runs each client against a fresh reference server (`benchmarks/refserver.py`, its own process:
kernel arrival stamps, TTFT 0, 1 ms between tokens, 32 tokens; its `loop` engine unless `--server-engine
threads`: the threaded one saturates at ~500-700 req/s on 2 cores, below the clients it is to measure) in
the same session, one after the other:

- **floor**: a raw asyncio client written here (`raw` sub-command, its own process): one HTTP/1.1 keep-alive
  connection per in-flight request on asyncio's Protocol API, a fixed JSON body of the same size as the
  bench's, the first-token stamp taken in `data_received`; it parses no JSON and keeps no figure. What
  the machine and Python can do, so a client's cost is read as a ratio to it;
- **floor+json** (`--floor-json`): the raw client that also decodes every SSE event's JSON (`json.loads` of
  each `data:` payload, nothing kept): what the least a client that reads the tokens' text (not just counts
  bytes) pays in CPython, the floor for any client that parses, as tokwatch must;
- **aiohttp**: the same requests with a plain aiohttp session (the HTTP client tokwatch is built on), the body
  taken in one piece at its end: what aiohttp itself costs per request, with no stamping, parsing or figures
  (it keeps no first-token stamp, so it has CPU and achieved-rate figures only);
- **tokwatch**: `python -m tokwatch bench` as a user runs it (`--no-server-metrics --no-store`, no plots,
  no warm-up), once per `--build NAME=PATH` (PATH goes first on PYTHONPATH: e.g. the tree before a change
  beside the tree after it, interleaved rung by rung so machine load hits both alike).

Open loop (Poisson and constant arrivals at each rate) and closed loop (each concurrency); a client that
achieved less than 90 % of a rate is not run at the higher rates of that arrival process (marked "not run"),
and the server holds at most 4,096 connections open (more wait in its listen backlog), so an overloaded rung
cannot pile up unbounded server threads or sockets. (512 was too few: a burst's new connections waited in the
backlog for a slot only a client's close frees, some until the drain limit, and the raw client's rate at
800 req/s came out as ~110 req/s with a fifth of its requests never read; docs/performance.md.) Per rung:

- **achieved**: requests per second between the first and the last kernel arrival at the server;
  **planned**: the rate of the client's own seeded schedule (a Poisson draw is a few % off the nominal
  rate); **held**: achieved >= 97 % of planned (open loop only);
- **TTFT err p50 / p99**: client TTFT - true TTFT (the server's first token write - the kernel's arrival stamp
  of the request's last byte), ms, over the requests joined with a kernel-stamped truth record;
  **clean**: TTFT err p99 < 5 ms;
- **CPU ms/req**: the client's CPU time (user + system, all its threads) over the run, per request: tokwatch's
  `summary.json` `client.cpu_per_request_s`, the floor's own `process_time()` over the same span; **proc**:
  the whole process from exec to exit (start-up, imports, end-of-run figures and files included);
- **x floor**: CPU per request over the floor's at the same rung.

    python benchmarks/bench_capacity.py                     # full ladder, ~15 min
    python benchmarks/bench_capacity.py --quick             # 3 rungs + c=16, 3 s each, ~2 min
    python benchmarks/bench_capacity.py --build new=exporter --build base=/tmp/base/exporter
    python benchmarks/bench_capacity.py --build "nowatch=exporter::--receive-watcher off" --rates ""
    python benchmarks/bench_capacity.py --hogs 2               # beside two busy-loop processes

For tokwatch it also prints its `client timing` verdict beside the real errors of the figures it judged
(`timing_truth.py`: requests flagged, really beyond tolerance and missed, per figure; TTFT and ITL error).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import resource
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from busy_host import hogs
from timing_truth import TimingTruth, counts, judge
from ttft_truth import SERVER_ENGINE_HELP, start_refserver, stop

CLEAN_P99_MS = 5.0
HELD_SHARE = 0.97
# A client that achieved less than this share of a rate is not run at the higher rates of that arrival
# process: past its capacity every rung only piles up connections (and the reference server's threads).
GIVE_UP_SHARE = 0.9
MAX_CONNECTIONS = 4096  # the reference server's cap on open connections (see the docstring)
DRAIN_S = 30.0  # the raw clients' wait for their requests in flight after the last send
_WORDS = ("the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on")
_PROMPT = " ".join(itertools.islice(itertools.cycle(_WORDS), 128))
BODY = json.dumps(
    {
        "model": "ref",
        "messages": [{"role": "user", "content": _PROMPT}],
        "max_tokens": 32,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "ignore_eos": True,
    }
).encode()


# --- the floor: a raw asyncio client ----------------------------------------------------------------------

_scan_once = json.JSONDecoder().scan_once  # json.loads' C scanner without its Python layers (floor+json)


@dataclass(slots=True)
class RawRecord:
    """One request of the raw client (perf_counter seconds)."""

    sent: float
    request_id: str = ""
    first: float | None = None
    last: float | None = None
    tokens: int = 0
    status: int = 0
    ok: bool = False


class _RawConn(asyncio.Protocol):
    """One keep-alive connection: write a request, stamp its reads, find the end of the chunked body."""

    def __init__(self, on_lost: Any, parse: bool = False) -> None:
        self.transport: asyncio.Transport | None = None
        self._record: RawRecord | None = None
        self._done: asyncio.Future[None] | None = None
        self._head = b""
        self._in_body = False
        self._tail = b""
        self._on_lost = on_lost
        self._parse = parse
        self._events = b""  # floor+json: the body's tail not yet cut into `data:` events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._done is not None and not self._done.done():
            self._done.set_result(None)
        self._on_lost(self)

    def send(self, request: bytes, record: RawRecord, done: asyncio.Future[None]) -> None:
        """Write one request; `done` resolves when its body ended."""
        self._record, self._done = record, done
        self._head, self._in_body, self._tail = b"", False, b""
        self._events = b""
        assert self.transport is not None
        record.sent = time.perf_counter()
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        rec = self._record
        if rec is None:
            return
        if not self._in_body:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self._head[:end], self._head[end + 4 :]
            self._in_body = True
            lines = head.split(b"\r\n")
            rec.status = int(lines[0].split(b" ")[1])
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"x-request-id":
                    rec.request_id = value.strip().decode()
            if not data:
                return
        rec.last = now
        tokens = data.count(b'"content"')
        if tokens and rec.first is None:
            rec.first = now
        rec.tokens += tokens
        if self._parse:
            self._decode_events(data)
        self._tail = (self._tail + data)[-5:]
        if self._tail == b"0\r\n\r\n":  # the chunked body's terminator
            rec.ok = rec.status == 200
            self._record = None
            assert self._done is not None
            self._done.set_result(None)

    def _decode_events(self, data: bytes) -> None:
        """floor+json: decode every complete `data:` payload with json's C scanner, as `tokwatch.streams`
        does (the HTTP chunk lines between events are skipped by the search for the next `data: `)."""
        buf = self._events + data if self._events else data
        start = 0
        while True:
            begin = buf.find(b"data: ", start)
            if begin < 0:
                self._events = buf[-5:]  # a "data: " the read's end cut in two
                return
            end = buf.find(b"\n\n", begin)
            if end < 0:
                self._events = buf[begin:]
                return
            payload = buf[begin + 6 : end]
            if payload != b"[DONE]":
                _scan_once(payload.decode(), 0)
            start = end + 2


class RawClient:
    """A pool of keep-alive connections; `one()` sends a request on an idle one or a new one."""

    def __init__(self, port: int, parse: bool = False) -> None:
        self.port = port
        self.parse = parse
        self.request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
        )
        self.idle: list[_RawConn] = []
        self.records: list[RawRecord] = []

    def _lost(self, conn: _RawConn) -> None:
        if conn in self.idle:
            self.idle.remove(conn)

    async def one(self) -> None:
        """One request, start to end of body."""
        loop = asyncio.get_running_loop()
        if self.idle:
            conn = self.idle.pop()
        else:
            transport, conn = await loop.create_connection(
                lambda: _RawConn(self._lost, self.parse), "127.0.0.1", self.port
            )
            conn.transport = transport  # uvloop may call connection_made only after this returned
        record = RawRecord(sent=time.perf_counter())
        self.records.append(record)
        done: asyncio.Future[None] = loop.create_future()
        conn.send(self.request, record, done)
        await done
        if conn.transport is not None and record.ok:
            self.idle.append(conn)


class AiohttpClient:
    """The same requests with a plain aiohttp session (no tracing, no stamping protocol): the body is read in
    one piece at its end (`wait_eof`), so no per-read wake-up either; the first token is stamped by the
    coroutine, and records only say how long the whole answer took. What aiohttp itself costs per request."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/v1/chat/completions"
        self.session: aiohttp.ClientSession | None = None
        self.records: list[RawRecord] = []

    async def one(self) -> None:
        """One request, start to end of body."""
        if self.session is None:
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        record = RawRecord(sent=time.perf_counter())
        self.records.append(record)
        headers = {"Content-Type": "application/json"}
        async with self.session.post(self.url, data=BODY, headers=headers) as resp:
            record.status, record.request_id = resp.status, resp.headers.get("x-request-id", "")
            await resp.content.wait_eof()
            body = resp.content.read_nowait()
            record.last = time.perf_counter()
            record.tokens = body.count(b'"content"')
            record.ok = resp.status == 200

    async def close(self) -> None:
        """Close the session."""
        if self.session is not None:
            await self.session.close()


async def _raw_run(args: argparse.Namespace) -> dict[str, Any]:
    client: RawClient | AiohttpClient = (
        AiohttpClient(args.port) if args.aiohttp else RawClient(args.port, parse=args.parse)
    )
    planned: list[float] = []  # the open loop's planned send times
    cpu0, t0 = time.process_time(), time.perf_counter()
    end = t0 + args.duration
    tasks: set[asyncio.Task[None]] = set()
    if args.concurrency:

        async def worker() -> None:
            while time.perf_counter() < end:
                await client.one()

        tasks = {asyncio.create_task(worker()) for _ in range(args.concurrency)}
    else:
        rng = random.Random(args.seed)
        due = t0
        while due < end:
            while (wait := due - time.perf_counter()) > 0:  # noqa: ASYNC110 - a clock, not an event
                await asyncio.sleep(wait)
            planned.append(due)
            task = asyncio.create_task(client.one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            due += rng.expovariate(args.rate) if args.arrivals == "poisson" else 1.0 / args.rate
    # In-flight requests get DRAIN_S to finish (an overloaded server may never answer them all); the rest are
    # abandoned and count as failed (not ok).
    if tasks:
        _, late = await asyncio.wait(set(tasks), timeout=DRAIN_S)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    cpu = time.process_time() - cpu0
    loop = asyncio.get_running_loop()
    if isinstance(client, AiohttpClient):
        await client.close()
    else:
        for conn in client.idle:
            if conn.transport is not None:
                conn.transport.close()
    return {
        "cpu_s": cpu,
        "event_loop": "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio",
        "records": [asdict(r) for r in client.records],
        "planned_rate": _rate(planned),
    }


def _rate(times: list[float]) -> float | None:
    """Events per second between the first and the last of `times` (n - 1 intervals)."""
    if len(times) < 2 or max(times) <= min(times):
        return None
    return (len(times) - 1) / (max(times) - min(times))


def raw_main(args: argparse.Namespace) -> int:
    """The floor client: run the load, write its records and CPU time as JSON."""
    try:
        import uvloop  # the same loop tokwatch bench uses when installed

        loop_factory: Any = uvloop.new_event_loop
    except ImportError:
        loop_factory = asyncio.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        result = runner.run(_raw_run(args))
    Path(args.out).write_text(json.dumps(result))
    return 0


# --- the ladder --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rung:
    """One load point: an open-loop rate with its arrival process, or a closed-loop concurrency."""

    rate: float | None = None
    arrivals: str = "poisson"
    concurrency: int | None = None

    @property
    def name(self) -> str:
        """e.g. "poisson 800/s" or "closed c=16"."""
        if self.concurrency is not None:
            return f"closed c={self.concurrency}"
        return f"{self.arrivals} {self.rate:g}/s"


@dataclass(slots=True)
class Result:
    """One client at one rung."""

    client: str
    rung: Rung
    requests: int = 0
    ok: int = 0
    joined: int = 0
    achieved: float | None = None
    planned: float | None = None  # the rate of the client's own (seeded) schedule
    err_p50_ms: float | None = None
    err_p99_ms: float | None = None
    cpu_ms: float | None = None
    proc_cpu_ms: float | None = None
    event_loop: str = ""
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    timing: TimingTruth | None = None  # tokwatch only: its client timing verdict against the truth

    @property
    def held(self) -> bool | None:
        """Achieved at least 97 % of the rate planned (open loop): the client's own seeded schedule, whose
        rate a Poisson draw of a few thousand arrivals puts a few % off the nominal one either way."""
        if self.rung.rate is None:
            return None
        planned = self.planned or self.rung.rate
        return self.achieved is not None and self.achieved >= HELD_SHARE * planned

    @property
    def clean(self) -> bool:
        """TTFT error p99 under 5 ms."""
        return self.err_p99_ms is not None and self.err_p99_ms < CLEAN_P99_MS


def load_average() -> str:
    """The 1/5/15-minute load averages."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def _percentile(values: list[float], q: float) -> float:
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo, hi = int(pos), min(int(pos) + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def fetch_truth(port: int) -> dict[str, dict[str, Any]]:
    """The server's truth log by request id."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/truth", timeout=60) as resp:
        lines = resp.read().decode().splitlines()
    return {t["request_id"]: t for t in map(json.loads, lines)}


def run_child(
    cmd: list[str], env: dict[str, str], timeout: float
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run a client process; returns it and its whole CPU time (user + system, children waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    except subprocess.TimeoutExpired:  # subprocess.run killed it
        done = subprocess.CompletedProcess(cmd, -9, "", f"killed after {timeout:g} s")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done, cpu


def _load_flags(rung: Rung, duration: float) -> list[str]:
    if rung.concurrency is not None:
        return ["--concurrency", str(rung.concurrency), "--duration", f"{duration:g}"]
    return ["--rate", f"{rung.rate:g}", "--arrivals", rung.arrivals, "--duration", f"{duration:g}"]


def parse_builds(items: list[str] | None) -> list[tuple[str, str, list[str]]]:
    """`--build NAME=PATH[::ARGS]` values as (name, resolved path or "" for the installed one, extra `tokwatch
    bench` arguments); none given: the installed tokwatch."""
    builds = []
    for item in items or ["tokwatch="]:
        name, _, rest = item.partition("=")
        path, _, extra = rest.partition("::")
        builds.append((name, str(Path(path).resolve()) if path else "", shlex.split(extra)))
    return builds


def floor_command(name: str, rung: Rung, args: argparse.Namespace, port: int, out: Path) -> list[str]:
    """The raw client's command line (`floor`, `floor+json` or `aiohttp`) at one rung; records to `out`."""
    return [
        *(sys.executable, str(Path(__file__).resolve()), "raw", "--port", str(port), "--out", str(out)),
        *("--seed", str(args.seed), *_load_flags(rung, args.duration)),
        *(["--aiohttp"] if name == "aiohttp" else []),
        *(["--parse"] if name == "floor+json" else []),
    ]


def measure_floor(
    rung: Rung, args: argparse.Namespace, port: int, tmp: Path, *, name: str = "floor"
) -> Result:
    """The raw client (`floor`; `floor+json` decoding every event; `aiohttp` the plain aiohttp one) at one
    rung."""
    out = tmp / "raw.json"
    cmd = floor_command(name, rung, args, port, out)
    done, proc_cpu = run_child(cmd, dict(os.environ), args.duration * 6 + 60)
    result = Result(name, rung)
    if done.returncode != 0:
        result.note = f"raw client failed: {done.stderr.strip()[-300:]}"
        return result
    raw = json.loads(out.read_text())
    truths = fetch_truth(port)
    rows = []
    for r in raw["records"]:
        t = truths.get(r["request_id"])
        if not r["ok"] or r["first"] is None or t is None or t["first_write_perf_s"] is None:
            continue
        if t["arrival_source"] == "kernel":
            rows.append((r["first"] - r["sent"]) - (t["first_write_perf_s"] - t["arrival_perf_s"]))
    result.requests, result.ok = len(raw["records"]), sum(r["ok"] for r in raw["records"])
    _fill(result, rows, truths, raw["cpu_s"], proc_cpu, len(raw["records"]))
    result.event_loop = raw["event_loop"]
    result.planned = raw["planned_rate"]
    return result


def tokwatch_command(
    pythonpath: str, extra: list[str], rung: Rung, args: argparse.Namespace, port: int, out: Path
) -> tuple[list[str], dict[str, str]]:
    """`tokwatch bench`'s command line and environment (the build at `pythonpath`, with `extra` arguments) at
    one rung; its output directory is `out`."""
    cmd = [sys.executable, "-m", "tokwatch", "bench", "--url", f"http://127.0.0.1:{port}/v1"]
    cmd += [
        "--kind",
        "openai",
        "--model",
        "ref",
        "--no-server-metrics",
        "--no-store",
        "--live-interval",
        "3600",
        "--warmup",
        "0",
    ]
    cmd += ["--input-tokens", "128", "--output-tokens", str(args.tokens), "--timeout", "60s"]
    cmd += ["--seed", str(args.seed), "--output-dir", str(out), *_load_flags(rung, args.duration), *extra]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH", "")) if p)
    env["MPLBACKEND"] = "Agg"
    return cmd, env


def measure_tokwatch(
    name: str, pythonpath: str, extra: list[str], rung: Rung, args: argparse.Namespace, port: int, tmp: Path
) -> Result:
    """`tokwatch bench` (the build at `pythonpath`, with `extra` arguments) at one rung."""
    out = tmp / f"bench-{name}"
    cmd, env = tokwatch_command(pythonpath, extra, rung, args, port, out)
    done, proc_cpu = run_child(cmd, env, args.duration * 6 + 120)
    result = Result(name, rung)
    # 1: an SLO missed, 6: the client timing health check failed (figures the client's own lateness moved
    # beyond tolerance): the run itself went through and wrote its figures.
    if done.returncode not in (0, 1, 6) or not (out / "summary.json").is_file():
        result.note = f"tokwatch bench failed ({done.returncode}): {done.stderr.strip()[-300:]}"
        return result
    if done.returncode == 6:
        result.note = "client timing FAIL (exit 6)"
    summary = json.loads((out / "summary.json").read_text())
    client = summary["client"]
    records = [json.loads(line) for line in (out / "request_level_metrics.jsonl").read_text().splitlines()]
    truths = fetch_truth(port)
    rows = []
    for r in records:
        t = truths.get(r.get("server_request_id") or "")
        if r["status"] != "ok" or r["ttft_s"] is None or t is None or t["first_write_perf_s"] is None:
            continue
        if t["arrival_source"] == "kernel":
            rows.append(r["ttft_s"] - (t["first_write_perf_s"] - t["arrival_perf_s"]))
    result.requests, result.ok = len(records), sum(r["status"] == "ok" for r in records)
    _fill(result, rows, truths, float(client["cpu_s"]), proc_cpu, len(records))
    result.event_loop = str(client.get("event_loop", ""))
    result.planned = _rate([r["intended_at_s"] for r in records if r.get("intended_at_s") is not None])
    result.extra = {k: v for k, v in client.items() if k not in ("cpu_s", "perf_counter_origin_s")}
    result.timing = judge(records, truths, float(client.get("perf_counter_origin_s") or 0.0), out)
    return result


def _fill(
    result: Result,
    errors: list[float],
    truths: dict[str, dict[str, Any]],
    cpu_s: float,
    proc_cpu_s: float,
    requests: int,
) -> None:
    result.joined = len(errors)
    if errors:
        result.err_p50_ms = _percentile(errors, 50) * 1e3
        result.err_p99_ms = _percentile(errors, 99) * 1e3
    arrivals = sorted(t["arrival_perf_s"] for t in truths.values())
    if len(arrivals) > 1 and arrivals[-1] > arrivals[0]:
        result.achieved = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
    if requests:
        result.cpu_ms = cpu_s / requests * 1e3
        result.proc_cpu_ms = proc_cpu_s / requests * 1e3


def ladder(args: argparse.Namespace) -> list[Rung]:
    """The rungs in the order they run."""
    rungs = [Rung(rate=r, arrivals=a) for a in args.arrivals for r in args.rates]
    rungs += [Rung(concurrency=c) for c in args.concurrencies]
    return rungs


def _f(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def render(results: list[Result]) -> str:
    """One Markdown table: every client at every rung, ratios against the floor of the same rung."""
    floors = {r.rung: r for r in results if r.client == "floor"}
    lines = [
        "| rung | client | achieved / planned req/s | held | TTFT err p50 / p99 ms | clean "
        "| CPU ms/req (proc) | x floor |",
        "|---|---|---:|:---:|---:|:---:|---:|---:|",
    ]
    for r in results:
        floor = floors.get(r.rung)
        ratio = (
            f"{r.cpu_ms / floor.cpu_ms:.2f}"
            if floor is not None and r.cpu_ms and floor.cpu_ms and r.client != "floor"
            else ""
        )
        held = "" if r.held is None else ("yes" if r.held else "**no**")
        clean = "-" if r.client == "aiohttp" else ("yes" if r.clean else "**no**")
        lines.append(
            f"| {r.rung.name} | {r.client} | {_f(r.achieved, '.0f')}"
            + (f" / {_f(r.planned, '.0f')}" if r.rung.rate is not None else "")
            + f" | {held} "
            f"| {_f(r.err_p50_ms)} / {_f(r.err_p99_ms)} | {clean} "
            f"| {_f(r.cpu_ms)} ({_f(r.proc_cpu_ms)}) | {ratio} |" + (f" {r.note}" if r.note else "")
        )
    return "\n".join(lines)


def timing_figures(t: TimingTruth) -> dict[str, Any]:
    """A run's client timing verdict and real errors (ms): TTFT error p50 / p99 (signed), ITL error p50
    (signed) / p99 of |error|, per-figure counts."""
    itl_abs = [abs(x) for x in t.itl_err]
    return {
        "verdict": t.verdict,
        "joined": t.joined,
        "flagged_requests": t.flagged_requests,
        "flagged": t.flagged,
        "real": t.real,
        "missed": t.missed,
        "ttft_err_p50_ms": _percentile(t.ttft_err, 50) * 1e3 if t.ttft_err else None,
        "ttft_err_p99_ms": _percentile(t.ttft_err, 99) * 1e3 if t.ttft_err else None,
        "itl_err_p50_ms": _percentile(t.itl_err, 50) * 1e3 if t.itl_err else None,
        "itl_abs_err_p99_ms": _percentile(itl_abs, 99) * 1e3 if itl_abs else None,
        "stamp_short": t.stamp_short,
        "stamp_excess_max_ms": None if t.stamp_excess_max_s is None else t.stamp_excess_max_s * 1e3,
        "published_beyond": t.published_beyond,
        "published_real": t.published_real,
        "published_missed": t.published_missed,
    }


def _names(names: list[str] | None) -> str:
    """`ttft p99, tbt p50`, `0` for none, `-` when not judged."""
    return "-" if names is None else ", ".join(names) or "0"


def render_timing(results: list[Result]) -> str:
    """tokwatch's `client timing` verdict per rung beside the real errors (timing_truth.py)."""
    lines = [
        "| rung | client | client timing | published figures beyond tolerance: bound / real / missed "
        "| requests flagged (per figure) | flagged and really beyond "
        "| missed | TTFT err p50 / p99 ms | ITL err p50 / abs p99 ms | stamp short (worst excess ms) |",
        "|---|---|:---:|---|---|---|---|---:|---:|---:|",
    ]
    for r in results:
        if r.timing is None:
            continue
        f = timing_figures(r.timing)
        lines.append(
            f"| {r.rung.name} | {r.client} | {f['verdict']} | {_names(f['published_beyond'])} / "
            f"{_names(f['published_real'])} / {_names(f['published_missed'])} "
            f"| {f['flagged_requests']}/{f['joined']} "
            f"({counts(f['flagged'])}) | {counts(f['real'])} | {counts(f['missed'])} "
            f"| {_f(f['ttft_err_p50_ms'])} / {_f(f['ttft_err_p99_ms'])} "
            f"| {_f(f['itl_err_p50_ms'], '.3f')} / {_f(f['itl_abs_err_p99_ms'], '.3f')} "
            f"| {f['stamp_short']} ({_f(f['stamp_excess_max_ms'], '.3f')}) |"
        )
    return "\n".join(lines)


def _up_to(results: list[Result], ok: Any) -> float:
    """The highest rate up to which every rung passed `ok` (0 when the lowest did not)."""
    best = 0.0
    for r in sorted(results, key=lambda r: r.rung.rate or 0.0):
        if not ok(r):
            break
        best = r.rung.rate or 0.0
    return best


def summary_lines(results: list[Result], rungs: list[Rung]) -> list[str]:
    """Per client and arrival process: up to which rate every rung was clean, held, and both."""
    out = []
    for client in dict.fromkeys(r.client for r in results):
        for arrivals in dict.fromkeys(r.arrivals for r in rungs if r.rate is not None):
            mine = [r for r in results if r.client == client and r.rung.arrivals == arrivals and r.rung.rate]
            if not mine:
                continue
            held = _up_to(mine, lambda r: r.held)
            if client == "aiohttp":
                out.append(f"{client}, {arrivals}: held up to {held:g} req/s (no TTFT figures)")
                continue
            clean = _up_to(mine, lambda r: r.clean)
            both = _up_to(mine, lambda r: r.clean and r.held)
            out.append(
                f"{client}, {arrivals}: clean up to {clean:g}, held up to {held:g}, "
                f"clean and held up to {both:g} req/s"
            )
    return out


def machine() -> str:
    """CPU model, cores, kernel, Python and library versions."""
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = []
    for mod in ("aiohttp", "uvloop", "numpy"):
        try:
            versions.append(f"{mod} {__import__(mod).__version__}")
        except ImportError:
            versions.append(f"no {mod}")
    return (
        f"{model}, {os.cpu_count()} CPUs, Linux {platform.release()}, Python {platform.python_version()}, "
        + ", ".join(versions)
    )


def main(argv: list[str] | None = None) -> int:
    """Run the ladder and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="command")
    raw = sub.add_parser("raw", help="(internal) the floor client at one load point")
    raw.add_argument("--port", type=int, required=True)
    raw.add_argument("--out", required=True)
    raw.add_argument("--rate", type=float)
    raw.add_argument("--arrivals", default="poisson", choices=("poisson", "constant"))
    raw.add_argument("--concurrency", type=int)
    raw.add_argument("--duration", type=float, default=10.0)
    raw.add_argument("--seed", type=int, default=0)
    raw.add_argument("--aiohttp", action="store_true", help="the plain aiohttp client instead")
    raw.add_argument("--parse", action="store_true", help="decode every event's JSON (floor+json)")
    ap.add_argument("--quick", action="store_true", help="rates 400,800,1200 Poisson and c=16, 3 s each")
    ap.add_argument("--rates", default="200,400,600,800,1000,1200,1600", help="open-loop rates, req/s")
    ap.add_argument("--arrivals", default="poisson,constant")
    ap.add_argument("--concurrencies", default="1,16,64", help="closed-loop points ('' for none)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per rung and client")
    ap.add_argument(
        "--build",
        action="append",
        default=[],
        metavar="NAME=PATH[::ARGS]",
        help="a tokwatch tree to run (PATH first on PYTHONPATH; ARGS: more `tokwatch bench` arguments); "
        "repeatable; default: the tokwatch this Python imports, named tokwatch",
    )
    ap.add_argument("--no-floor", action="store_true", help="skip the raw client")
    ap.add_argument("--no-aiohttp", action="store_true", help="skip the plain aiohttp client")
    ap.add_argument("--floor-json", action="store_true", help="also the raw client that decodes every event")
    ap.add_argument("--ttft", type=float, default=0.0)
    ap.add_argument("--gap", type=float, default=0.001)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--server-engine", choices=("loop", "threads"), default="loop", help=SERVER_ENGINE_HELP)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write every result here too")
    ap.add_argument(
        "--hogs",
        type=int,
        default=0,
        help="busy-loop processes at normal priority beside every rung (a busy host)",
    )
    args = ap.parse_args(argv)
    if args.command == "raw":
        return raw_main(args)
    if args.quick:
        args.rates, args.arrivals, args.concurrencies, args.duration = "400,800,1200", "poisson", "16", 3.0
    args.rates = [float(x) for x in args.rates.split(",") if x.strip()]
    args.arrivals = [x.strip() for x in args.arrivals.split(",") if x.strip()]
    args.concurrencies = [int(x) for x in args.concurrencies.split(",") if x.strip()]
    builds = parse_builds(args.build)
    rungs = ladder(args)
    clients = (0 if args.no_floor else 1) + int(args.floor_json) + (0 if args.no_aiohttp else 1) + len(builds)
    estimate = len(rungs) * clients * (args.duration + 4)
    print(f"# capacity ladder: {len(rungs)} rungs x {clients} clients, about {estimate / 60:.0f} min")
    print(f"machine: {machine()}")
    print(
        f"server: benchmarks/refserver.py --engine {args.server_engine} --ttft {args.ttft:g} "
        f"--gap {args.gap:g} --tokens {args.tokens}"
    )
    print("builds: " + ", ".join(f"{n}={p or 'as installed'} {' '.join(x)}".strip() for n, p, x in builds))
    print(f"load average before: {load_average()}", flush=True)
    if args.hogs:
        print(f"busy host: {args.hogs} busy-loop processes (benchmarks/busy_host.py's) beside every rung")
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmpdir, hogs([None] * args.hogs):
        tmp = Path(tmpdir)
        gave_up: dict[tuple[str, str], float] = {}  # (client, arrivals) -> the rate it fell short at
        for rung in rungs:
            runs: list[tuple[str, str | None, list[str]]] = [] if args.no_floor else [("floor", None, [])]
            runs += [("floor+json", None, [])] if args.floor_json else []
            runs += [] if args.no_aiohttp else [("aiohttp", None, [])]
            runs += builds
            for name, path, extra in runs:
                short = gave_up.get((name, rung.arrivals)) if rung.rate is not None else None
                if short is not None:
                    skipped = Result(name, rung, note=f"not run: fell short at {short:g}/s")
                    results.append(skipped)
                    print(f"{rung.name:<18} {name:<10} {skipped.note}", flush=True)
                    continue
                proc, port = start_refserver(args, "--max-connections", str(MAX_CONNECTIONS))
                try:
                    if path is None:
                        r = measure_floor(rung, args, port, tmp, name=name)
                    else:
                        r = measure_tokwatch(name, path, extra, rung, args, port, tmp)
                finally:
                    stop(proc)
                results.append(r)
                if rung.rate is not None and (r.achieved or 0.0) < GIVE_UP_SHARE * (r.planned or rung.rate):
                    gave_up[name, rung.arrivals] = rung.rate
                timing = ""
                if r.timing is not None:
                    tf = timing_figures(r.timing)
                    timing = (
                        f"client timing {tf['verdict']} published beyond {_names(tf['published_beyond'])} "
                        f"(really {_names(tf['published_real'])}; missed {_names(tf['published_missed'])}) "
                        f"flagged {tf['flagged_requests']} "
                        f"({counts(tf['flagged'])}; really {counts(tf['real'])}; "
                        f"missed {counts(tf['missed'])})  ITL err p50 "
                        f"{_f(tf['itl_err_p50_ms'], '.3f')} |p99| {_f(tf['itl_abs_err_p99_ms'], '.3f')} ms  "
                    )
                print(
                    f"{rung.name:<18} {name:<10} achieved {_f(r.achieved, '7.1f')}/s  TTFT err p50 "
                    f"{_f(r.err_p50_ms)} p99 {_f(r.err_p99_ms)} ms  joined {r.joined}/{r.requests}  CPU "
                    f"{_f(r.cpu_ms, '.3f')} ms/req (process {_f(r.proc_cpu_ms, '.3f')})  {r.event_loop}  "
                    f"{timing}load {load_average()} {r.note}",
                    flush=True,
                )
    print()
    print(render(results))
    print()
    if any(r.timing is not None for r in results):
        print(render_timing(results))
        print()
    print("\n".join(summary_lines(results, rungs)))
    print(
        f"\nclean: TTFT err p99 < {CLEAN_P99_MS:g} ms against the kernel's arrival stamp; held: achieved "
        f"(server arrivals) >= {HELD_SHARE:.0%} of the client's planned schedule rate; CPU: in-run (whole "
        "process); x floor: in-run CPU per request over the raw client's at the same rung."
    )
    print(f"load average after: {load_average()}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                [
                    {
                        **asdict(r),
                        "rung": asdict(r.rung),
                        "held": r.held,
                        "clean": r.clean,
                        "timing": None if r.timing is None else timing_figures(r.timing),
                    }
                    for r in results
                ],
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
