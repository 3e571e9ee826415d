#!/usr/bin/env python3
"""A store full of compaction holes against the same messages without them (issue 13).

    python bench/bench_holes.py             # needs the compacted bench store (make_store --compacted)

The store the real 4.3.6 broker compacted (``make_store.build_compacted``: ~11,000 zero-filled
holes in 16 MiB files a third live) is rewritten by ``cqforensics compact`` into a copy with the
same 80,000 messages and no holes. The full ``messages`` read (walk, resolution, decode) of
both is timed in CPU seconds, alternating, best of 3 each, in one run: the ratio is what
counts, not the absolute figures. Results: ``bench/results/holes.{json,md}``.

Both stores are first dropped from the page cache and read once (not timed): each is then
cached as the tool's own read of it from disk caches it. Left as they were, the broker's small
appends had cached the compacted store in 4 KiB pages and ``compact``'s large writes the
rewritten one in large folios, and the ratio measured that history (mapping or reading a file
costs per cached page) more than the holes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from make_store import build_clean, build_compacted, compacted_dir  # noqa: E402

import cqforensics  # noqa: E402

RESULTS = HERE / "results"


def read_cpu(mnesia: Path) -> tuple[int, float]:
    t = time.process_time()
    n = sum(b.num_rows for b in cqforensics.iter_batches(mnesia, "messages"))
    return n, time.process_time() - t


def drop_cached(root: Path) -> None:
    """Write back and drop from the page cache every file under ``root``."""
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def main() -> int:
    holed = build_compacted().parent
    clean = build_clean(compacted_dir()).parent  # the same store cleanly stopped (make_store.build_clean)
    plain = Path("/var/tmp/cqf-bench-holes-rewritten")
    shutil.rmtree(plain, ignore_errors=True)
    subprocess.run(
        [sys.executable, "-m", "cli.main", "compact", str(holed), str(plain), "-q"],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    holes = sum(
        1 for r in cqforensics.read_table(holed, "holes", columns=["kind"]).to_pylist() if r["kind"] == "zeroed"
    )
    best = {"holed": float("inf"), "rewritten": float("inf"), "holed, cleanly stopped": float("inf")}
    counts = {}
    drop_cached(holed), drop_cached(plain), drop_cached(clean)
    read_cpu(holed), read_cpu(plain), read_cpu(clean)  # cache them as a read of them from disk does
    for _ in range(3):
        for name, path in (("holed", holed), ("rewritten", plain), ("holed, cleanly stopped", clean)):
            n, s = read_cpu(path)
            counts[name] = n
            best[name] = min(best[name], s)
    assert counts["holed"] == counts["rewritten"] == counts["holed, cleanly stopped"], counts
    n = counts["holed"]
    out = {
        "messages": n,
        "zeroed_holes": holes,
        "cpu_s": best,
        "msg_per_s": {k: n / v for k, v in best.items()},
        "holed_over_rewritten": best["holed"] / best["rewritten"],
    }
    shutil.rmtree(plain, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "holes.json").write_text(json.dumps(out, indent=1) + "\n")
    md = (
        "| store | messages | zeroed holes | CPU s (best of 3) | messages/s |\n|---|---|---|---|---|\n"
        f"| compacted by the broker | {n:,} | {holes:,} | {best['holed']:.3f} | {n / best['holed']:,.0f} |\n"
        f"| the same, rewritten without holes | {n:,} | 0 | {best['rewritten']:.3f} | "
        f"{n / best['rewritten']:,.0f} |\n"
        f"| the compacted store cleanly stopped | {n:,} | {holes:,} | {best['holed, cleanly stopped']:.3f} | "
        f"{n / best['holed, cleanly stopped']:,.0f} |\n\nholed / rewritten: {out['holed_over_rewritten']:.2f}x CPU per "
        f"message; cleanly stopped / killed: {best['holed, cleanly stopped'] / best['holed']:.2f}x\n"
    )
    (RESULTS / "holes.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
