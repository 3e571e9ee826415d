#!/usr/bin/env python3
"""Every core: each command with ``-j 1`` and ``-j N`` on the 1x bench store (issue 32 item 3).

    python bench/bench_jobs.py                 # -j 1 against -j 2, best of 3, alternating
    python bench/bench_jobs.py --jobs 2 --repeat 5 --only fsck export-jsonl

Each command runs as ``cqforensics`` in a fresh process, ``-j 1`` and ``-j N`` one after the
other, ``--repeat`` times (alternating, so both meet the same machine: it may be shared, compare
ratios within one run). The table gives the best wall time of each, the CPU seconds of that run
(the command and its workers), the ratio, and whether the outputs are identical (byte for byte;
fsck's JSON less its ``created`` time; files less the times and manifests that name their run:
a Parquet file by its rows, row groups and schema). The store is ``bench/make_store.py``'s 1x
store (a real 4.3.6 broker's, kill -9; built on first use). Results: ``bench/results/jobs.md``
and ``jobs.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from make_store import CLI, CLI_ENV, build, core_status, node_dir  # noqa: E402

AS_OF = "2030-01-01T00:00:00Z"
#: name -> (arguments after the command's path, what to compare: stdout or the files written)
COMMANDS = {
    "fsck": (["fsck", "--json"], "json"),
    "fsck-text": (["fsck"], "stdout"),
    "read-messages-parquet": (
        ["read", "--table", "messages", "--format", "parquet", "--out", "{out}/m.parquet"],
        "files",
    ),
    "read-messages-jsonl": (["read", "--table", "messages", "--format", "jsonl"], "stdout"),
    "read-messages-text": (
        ["read", "--table", "messages", "--columns", "queue,seq_id,msg_id,size,survives_restart"],
        "stdout",
    ),
    "read-findings": (["read", "--table", "findings", "--format", "jsonl"], "stdout"),
    "export-jsonl": (["export", "--format", "jsonl", "--out", "{out}/e"], "files"),
    "export-parquet": (["export", "--format", "parquet", "--out", "{out}/e"], "files"),
    "audit": (["audit", "--json"], "stdout"),
    "verify": (["verify", "--json"], "json"),
}


def digest_tree(root: Path) -> str:
    """What a run wrote, less what names its run (``created`` times; the outputs' manifests,
    ``.cqforensics-output.json``, which record when and by which process): the rows and their
    order, the files' names and their other bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.name.endswith(".cqforensics-output.json"):
            continue
        h.update(str(p.relative_to(root)).encode())
        if p.name.endswith(".provenance.json"):
            doc = json.loads(p.read_text())
            doc["created"] = None
            h.update(json.dumps(doc, sort_keys=True).encode())
        elif p.suffix == ".parquet":  # its rows, row groups and schema; the provenance less its time
            f = pq.ParquetFile(p)
            h.update(str([f.metadata.row_group(i).num_rows for i in range(f.num_row_groups)]).encode())
            meta = dict(f.schema_arrow.metadata or {})
            if b"cqforensics.provenance" in meta:
                doc = json.loads(meta[b"cqforensics.provenance"])
                doc["created"] = None
                meta[b"cqforensics.provenance"] = json.dumps(doc, sort_keys=True).encode()
            h.update(repr(sorted(meta.items())).encode())
            for batch in f.iter_batches(batch_size=65536):
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, batch.schema.remove_metadata()) as w:
                    w.write_batch(batch)
                h.update(sink.getvalue())
        else:
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 24), b""):
                    h.update(chunk)
    return h.hexdigest()


def run(node: Path, name: str, jobs: int) -> dict:
    """One command in a fresh process: wall and CPU seconds (with its workers), and a digest of
    what it wrote."""
    args, compare = COMMANDS[name]
    out = Path(tempfile.mkdtemp(prefix="cqf-bench-jobs-"))
    try:
        argv = [a.format(out=out) for a in args]
        when = ["--as-of", AS_OF] if argv[0] != "verify" else []  # verify judges no TTL
        cmd = [*CLI, argv[0], str(node), *argv[1:], *when, "-j", str(jobs)]
        h, kept = hashlib.sha256(), []  # stdout hashed as it comes (a jsonl read is GBs); JSON kept
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        with open(out / "stderr", "w+b") as err:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=CLI_ENV)
            for chunk in iter(lambda: p.stdout.read(1 << 20), b""):
                h.update(chunk)
                if compare == "json":
                    kept.append(chunk)
            p.wait()
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if p.returncode not in (0, 4):
                err.seek(0)
                raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}: {err.read().decode()[-2000:]}")
        (out / "stderr").unlink()
        if compare == "json":
            doc = json.loads(b"".join(kept))
            if "provenance" in doc:
                doc["provenance"]["created"] = None
            digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
        elif compare == "stdout":
            digest = h.hexdigest()
        else:
            digest = digest_tree(out)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return {"wall": wall, "cpu": cpu, "digest": digest, "exit": p.returncode}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2, help="N of -j N (against -j 1)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", nargs="*", choices=sorted(COMMANDS))
    ap.add_argument("--scale", type=float, default=1.0, help="the bench store's scale (make_store)")
    args = ap.parse_args()
    print(f"compiled core: {core_status()}", flush=True)
    build(args.scale)
    node = node_dir(args.scale)
    names = args.only or list(COMMANDS)
    load = os.getloadavg()
    results: dict[str, dict[int, list[dict]]] = {n: {1: [], args.jobs: []} for n in names}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for k in range(args.repeat):
        for name in names:
            for j in (1, args.jobs) if k % 2 == 0 else (args.jobs, 1):  # alternating
                results[name][j].append(run(node, name, j))
                print(f"  {name} -j {j}: {results[name][j][-1]['wall']:.2f} s", file=sys.stderr, flush=True)
    rows = []
    for name in names:
        one = min(results[name][1], key=lambda r: r["wall"])
        many = min(results[name][args.jobs], key=lambda r: r["wall"])
        same = len({r["digest"] for j in (1, args.jobs) for r in results[name][j]}) == 1
        rows.append(
            {
                "command": name,
                "wall_1": one["wall"],
                "cpu_1": one["cpu"],
                "wall_n": many["wall"],
                "cpu_n": many["cpu"],
                "ratio": one["wall"] / many["wall"],
                "identical": same,
            }
        )
    lines = [
        f"# -j 1 against -j {args.jobs}, {node} ({started}; best of {args.repeat}, alternating; "
        f"load average at the start {load[0]:.1f}, {os.cpu_count()} CPUs)",
        "",
        f"| command | -j 1 wall s (CPU s) | -j {args.jobs} wall s (CPU s) | speed-up | identical output |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['command']} | {r['wall_1']:.2f} ({r['cpu_1']:.2f}) | {r['wall_n']:.2f} ({r['cpu_n']:.2f}) | "
            f"**{r['ratio']:.2f}x** | {'yes' if r['identical'] else 'NO'} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "jobs.md").write_text(text)
    (out / "jobs.json").write_text(
        json.dumps({"started": started, "load": load, "jobs": args.jobs, "rows": rows, "runs": results}, indent=1)
    )
    if not all(r["identical"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
