"""What changes when a file is replaced or rewritten: how rotated key, certificate and password files are
noticed without a restart."""

from __future__ import annotations

import os


def file_version(path: str) -> tuple[int, int, int] | None:
    """(inode, size, mtime) of a file, None when it is missing or unreadable to stat."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)
