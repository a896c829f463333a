"""How precisely, and at what CPU, does the open loop reach a planned send instant? Loop timers vs a timerfd.

The open loop waits for each request's planned instant. Measured here on an otherwise idle loop (so only the
wait itself shows): `--waits` instants spaced by exponential gaps of mean `--mean-gap-ms` (a Poisson
schedule), each waited for by

- **loop timer**: the bench's wait before the timerfd (a future and `call_later(remaining)`, re-armed until
  the clock reaches the instant; on uvloop a delay under half a millisecond runs at once, so it spins);
- **timerfd**: `tokwatch.transport.precise_timer.PreciseTimer` (one timerfd armed at the absolute instant);

on asyncio's loop and on uvloop's. Prints the lateness (clock at wake-up minus the instant) p50 / p99 / max
in microseconds, the loop passes per wait, and the CPU per wait, side by side with ratios to the loop timer.

    python benchmarks/send_timer.py                       # 2,000 waits, mean gap 2.5 ms (400 req/s)
    python benchmarks/send_timer.py --mean-gap-ms 0.8     # 1,250 req/s
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import random
import sys
import time
from collections.abc import Callable

from tokwatch.figures.stats import percentile
from tokwatch.transport.measurement import loop_name, new_loop
from tokwatch.transport.precise_timer import PreciseTimer, available


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def loop_timer_wait(deadline: float) -> int:
    """The bench's wait before the timerfd; returns its loop passes."""
    loop = asyncio.get_running_loop()
    passes = 0
    while (remaining := deadline - time.perf_counter()) > 0:
        waiter = loop.create_future()
        timer = loop.call_later(remaining, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
        passes += 1
    return passes


async def measure(kind: str, gaps: list[float]) -> tuple[list[float], float, float]:
    """(lateness of each wait in s, CPU s per wait, loop passes per wait)."""
    timer = PreciseTimer.open() if kind == "timerfd" else None
    late: list[float] = []
    passes = 0
    cpu0 = time.process_time()
    deadline = time.perf_counter() + 0.01
    try:
        for gap in gaps:
            deadline += gap
            if timer is not None:
                while time.perf_counter() < deadline:
                    await timer.until(deadline)
                    passes += 1
            else:
                passes += await loop_timer_wait(deadline)
            late.append(time.perf_counter() - deadline)
    finally:
        if timer is not None:
            timer.close()
    return late, (time.process_time() - cpu0) / len(gaps), passes / len(gaps)


def run(factory: Callable[[], asyncio.AbstractEventLoop], kind: str, gaps: list[float]) -> tuple[str, tuple]:
    async def main() -> tuple[str, tuple[list[float], float, float]]:
        return loop_name(asyncio.get_running_loop()), await measure(kind, gaps)

    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())


def main() -> int:
    """Print lateness and CPU per wait for each loop and wait."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--waits", type=int, default=2000)
    ap.add_argument("--mean-gap-ms", type=float, default=2.5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not available():
        print("no timerfd on this platform: nothing to compare")
        return 1
    rng = random.Random(args.seed)
    gaps = [rng.expovariate(1000.0 / args.mean_gap_ms) for _ in range(args.waits)]
    python = sys.version.split()[0]
    print(f"# {args.waits} waits, exponential gaps of mean {args.mean_gap_ms:g} ms, Python {python}")
    print("| loop | wait | lateness p50 / p99 / max us | loop passes | CPU us per wait | x loop timer |")
    print("|---|---|---:|---:|---:|---:|")
    # new_loop is uvloop's when installed, else asyncio's again (then measured once)
    factories = [asyncio.new_event_loop] + ([new_loop] if importlib.util.find_spec("uvloop") else [])
    for factory in factories:
        base_cpu = None
        for kind in ("loop timer", "timerfd"):
            name, (late, cpu, passes) = run(factory, kind, gaps)
            base_cpu = cpu if base_cpu is None else base_cpu
            us = [x * 1e6 for x in late]
            print(
                f"| {name} | {kind} | {percentile(us, 50):.0f} / {percentile(us, 99):.0f} / {max(us):.0f} | "
                f"{passes:.1f} | {cpu * 1e6:.1f} | {cpu / base_cpu:.2f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
