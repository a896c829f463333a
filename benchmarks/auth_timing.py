"""Basic-auth response times: an unknown user against a known user with a wrong password (user enumeration).

Starts the real exporter (`python -m tokwatch serve --web-config ...`) on 127.0.0.1 with two users whose
bcrypt hashes have cost 12 and 10, then sends `--requests` GET /metrics of each kind, interleaved, each with
a fresh random password (so no answer comes from the credential cache), and prints the median and p90 of
the response times and their ratio to the known user's. Before the fix the unknown user was checked
against a cost-4 hash: 7-20 ms against 114-143 ms (docs/security.md).

    python benchmarks/auth_timing.py [--requests 30]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bcrypt

from simproc import stop

USERS = {"prometheus": 12, "grafana": 10}  # user -> bcrypt cost of its hash


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, user: str, password: str) -> tuple[int, float]:
    """GET /metrics with basic auth; (status, seconds)."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        t0 = time.perf_counter()
        conn.request("GET", "/metrics", headers={"Authorization": f"Basic {token}"})
        status = conn.getresponse().status
        return status, time.perf_counter() - t0
    finally:
        conn.close()


def wait_listening(port: int, proc: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    """Until the exporter answers (401 without credentials) or the timeout passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"exporter exited with {proc.returncode}")
        try:
            get(port, "nobody", "x")
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("exporter did not start")


def p90(values: list[float]) -> float:
    """90th percentile (inclusive method)."""
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def main() -> None:
    """Print one row per kind of failed login."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--requests", type=int, default=30, help="requests of each kind (30)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        users = "\n".join(
            f"  {user}: {bcrypt.hashpw(b'right', bcrypt.gensalt(rounds=cost)).decode()}"
            for user, cost in USERS.items()
        )
        (base / "web.yml").write_text(f"basic_auth_users:\n{users}\n", encoding="utf-8")
        storage = f"{{sqlite_path: {base / 'tw.db'}, outbox_path: {base / 'outbox.jsonl'}}}"
        (base / "tokwatch.yml").write_text(f"storage: {storage}\nendpoints: []\n", encoding="utf-8")
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tokwatch", "serve", "--config", str(base / "tokwatch.yml"),
             "--web-config", str(base / "web.yml"), "--listen", f"127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        try:
            wait_listening(port, proc)
            kinds = {
                "unknown user": "no-such-user",
                **{f"{u} (cost {c}), wrong password": u for u, c in USERS.items()},
            }
            times: dict[str, list[float]] = {k: [] for k in kinds}
            for _ in range(args.requests):
                for kind, user in kinds.items():
                    status, seconds = get(port, user, secrets.token_hex(8))
                    if status != 401:
                        raise SystemExit(f"{kind}: expected 401, got {status}")
                    times[kind].append(seconds)
        finally:
            stop(proc)
    reference = statistics.median(times[f"prometheus (cost {USERS['prometheus']}), wrong password"])
    print(f"{args.requests} requests of each kind, interleaved; every answer 401")
    print("| failed login | median ms | p90 ms | median / known user's (cost 12) |")
    print("|---|---:|---:|---:|")
    for kind, values in times.items():
        med = statistics.median(values)
        print(f"| {kind} | {med * 1e3:.1f} | {p90(values) * 1e3:.1f} | {med / reference:.2f} |")


if __name__ == "__main__":
    main()
