"""PNG histograms per metric; needs the optional `plots` extra (matplotlib) and is skipped without it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

_SECONDS = frozenset(
    {"ttft", "ttot", "tbt", "inter_chunk", "output_itl", "tpot", "e2e", "normalized_latency"}
    | {"ttfc", "tbc", "normalized_end_to_end_latency"}  # seed 002's names (tokwatch.bench.seed_files)
)


def write_histograms(values: Mapping[str, Sequence[float]], out_dir: Path) -> list[Path] | None:
    """One `<metric>.png` per metric with data; None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on benchmark hosts
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    written = []
    for name, data in values.items():
        if not data:
            continue
        in_ms = name in _SECONDS
        shown = [v * 1e3 for v in data] if in_ms else list(data)
        fig, ax = plt.subplots(figsize=(6, 3.5))
        try:
            ax.hist(shown, bins=min(60, max(5, len(shown) // 5)))
            ax.set_title(name)
            ax.set_xlabel(f"{name} ({'ms' if in_ms else 'value'})")
            ax.set_ylabel("count")
            fig.tight_layout()
            path = out_dir / f"{name}.png"
            fig.savefig(path, dpi=80)
            written.append(path)
        finally:
            plt.close(fig)
    return written
