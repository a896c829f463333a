"""Pinned npm packages a test needs, installed on first use (`npm ci` from the directory's lock file)."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path


def install(directory: Path, *packages: str) -> str | None:
    """`npm ci` in `directory` unless `packages` are already under its node_modules; why not, or None. One
    install at a time per directory (test processes in parallel share it): the others wait, then find it."""
    with (directory / ".npm-install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _install(directory, *packages)


def _install(directory: Path, *packages: str) -> str | None:
    if all((directory / "node_modules" / p).is_dir() for p in packages):
        return None
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        return "node/npm not installed"
    cmd = [npm, "ci" if (directory / "package-lock.json").exists() else "install", "--no-audit", "--no-fund"]
    try:
        result = subprocess.run(cmd, cwd=directory, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"npm install failed: {exc}"
    return None if result.returncode == 0 else f"npm install failed: {result.stderr.strip()[-500:]}"
