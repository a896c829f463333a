"""Would compiling tokwatch's per-token Python help? A copy of the package with those modules compiled to C by
mypyc (the same source: no second implementation), timed against the interpreted package.

The modules a token's bytes pass through once read and that mypyc can compile as they are: the HTTP framing
(`http_wire`), the kernel-stamped transport (`kernel_stamps`), the stream parsers and collector
(`streams/*`), the timing math (`timing`) and the bench's request loop (`bench/client`). `http.py` stays
interpreted: mypyc does not compile async generators. The build is a throwaway copy in a temporary
directory; the package itself stays pure Python.

It prints `request_path.py`'s table (the per-request Python once the bytes are read, no sockets) for the
compiled copy against the interpreted tree, then, with `--rate` or `--concurrency`, `cpu_split.py`'s tables
for both in a live run against `benchmarks/refserver.py` (CPU per request by layer, beside the floor).
Needs mypy (which carries mypyc) and a C compiler with the Python headers.

    python benchmarks/compiled_path.py
    python benchmarks/compiled_path.py --rate 400 --keep /tmp/tokwatch-compiled
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TREE = HERE.parent / "exporter"  # the directory holding tokwatch/
MODULES = (
    "tokwatch/transport/http_wire.py",
    "tokwatch/transport/kernel_stamps.py",
    "tokwatch/figures/timing.py",
    "tokwatch/streams/events.py",
    "tokwatch/streams/framing.py",
    "tokwatch/streams/payload.py",
    "tokwatch/streams/shape.py",
    "tokwatch/streams/think.py",
    "tokwatch/streams/openai.py",
    "tokwatch/streams/collector.py",
    "tokwatch/bench/client.py",
)


def build(tree: Path, into: Path) -> str | None:
    """Copy `tree` to `into` and compile MODULES there; returns why it failed, or None."""
    mypyc = shutil.which("mypyc")
    if mypyc is None:
        return "mypyc is not installed (pip install mypy)"
    shutil.copytree(tree, into, ignore=shutil.ignore_patterns("__pycache__", "*.so", "build"))
    log = into / "mypyc.log"
    with log.open("w") as f:
        done = subprocess.run([mypyc, *MODULES], cwd=into, stdout=f, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        errors = [line for line in log.read_text().splitlines() if "error" in line]
        return f"mypyc failed: {(errors or ['see ' + str(log)])[0]}"
    missing = [m for m in MODULES if not list(into.glob(m.removesuffix(".py") + ".*.so"))]
    return f"mypyc built no extension for {', '.join(missing)}" if missing else None


def run(cmd: list[str], pythonpath: Path) -> int:
    """A benchmark script with `pythonpath` first on the path; its output goes straight to ours."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), str(HERE), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, *cmd], env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=TREE, help="the interpreted tree (holds tokwatch/)")
    ap.add_argument("--keep", type=Path, help="build the compiled copy here and keep it (must not exist)")
    ap.add_argument("--rate", type=float, help="also a live run at this open-loop rate (cpu_split.py)")
    ap.add_argument("--concurrency", type=int, help="also a live closed-loop run (cpu_split.py)")
    args = ap.parse_args(argv)
    tree = args.tree.resolve()
    if not (tree / "tokwatch").is_dir():
        print(f"compiled_path: --tree {tree}: no tokwatch/ package there", file=sys.stderr)
        return 2
    if args.keep is not None and args.keep.exists():
        print(f"compiled_path: --keep {args.keep}: already exists", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmpdir:
        into = args.keep.resolve() if args.keep is not None else Path(tmpdir) / "exporter"
        why = build(tree, into)
        if why is not None:
            print(f"compiled_path: {why}", file=sys.stderr)
            return 1
        print(f"# compiled with mypyc: {', '.join(MODULES)}\n# compiled copy: {into}; interpreted: {tree}\n")
        print("Per request once the bytes are read (request_path.py; baseline = interpreted):\n", flush=True)
        status = run([str(HERE / "request_path.py"), "--baseline", str(tree)], into)
        if status == 0 and (args.rate or args.concurrency):
            load = ["--rate", f"{args.rate:g}"] if args.rate else ["--concurrency", str(args.concurrency)]
            builds = ["--build", f"interpreted={tree}", "--build", f"compiled={into}"]
            print("\nIn a live run (cpu_split.py):\n", flush=True)
            status = run([str(HERE / "cpu_split.py"), *load, "--floor-json", *builds], into)
    return status


if __name__ == "__main__":
    sys.exit(main())
