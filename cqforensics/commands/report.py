"""report: one self-contained HTML page to look at a node, or a folder of many.

For every node and vhost: a map of its shared-store files (``.rdq``; one SVG bar per file, live
/ orphan / garbage / hole byte ranges, from the ``store``, ``holes`` and ``files`` tables), its
queues with their depth and what the next boot delivers or drops and why (``queues`` and
``messages``: ``survives_restart``, ``drop_reason``; crashes from fsck), and the findings
grouped by code with file and offset (fsck); for more than one node, a fleet summary (one row
per node: version inferred, messages, predicted drops, worst severity).

The page needs no network and runs nothing: inline CSS and SVG only, no script, and a
Content-Security-Policy that forbids any load or script anyway. Every string that comes from
the data (node, vhost, queue and file names, finding messages) is shown as text: passed through
``errors.display`` (undecodable bytes as ``\\xNN``), control and bidi-override characters
escaped, then HTML-escaped.

Reads only through the public read path (``api.iter_batches`` and ``fsck``, over node scans
made once for all of them: ``driver.open_nodes``), in a commands layer module: ``render(paths,
...)`` returns the page; the CLI (``cqforensics report``) checks the output path
(``outputs.check_output``) and writes it.
"""

from __future__ import annotations

import datetime as dt
import html
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from cqforensics.base.errors import display, plural
from cqforensics.base.findings import CODES, SEVERITY_RANK
from cqforensics.commands import fsck as fsck_mod
from cqforensics.discovery.nodes import STORAGE_KINDS
from cqforensics.read import api

BAR_UNITS = 1000  # SVG user units across a bar (the bar is stretched to the page width)
MAX_RECTS = 1500  # more byte ranges than this in one file: the bar is cut into COARSE_SLICES slices
COARSE_SLICES = 500
MAX_FINDINGS_SHOWN = 200  # rows per finding code and vhost (the count is always the full one)
MAX_TEXT = 1000  # characters of one shown string

#: byte-range category of each store status and hole kind (the colours of the map)
CATEGORY = {
    "live": "live",
    "orphan": "orphan",
    "duplicate": "garbage",
    "corrupt": "garbage",
    "garbage": "garbage",
    "stale": "garbage",
    "zeroed": "hole",
    "truncated_tail": "hole",
}
CATEGORIES = ("live", "orphan", "garbage", "hole")
CATEGORY_HELP = {
    "live": "entries the next boot uses",
    "orphan": "acked messages no index refers to (garbage until compaction)",
    "garbage": "duplicate copies, corrupt entries, unreadable bytes",
    "hole": "zeroed ranges and truncated tails",
}

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def text(value) -> str:
    """Any value from the data as HTML-escaped text (attribute-safe: quotes escaped too)."""
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if not isinstance(value, str):
        value = str(value)
    value = display(value)
    if len(value) > MAX_TEXT:
        value = value[:MAX_TEXT] + f"... ({len(value) - MAX_TEXT} more characters cut)"
    value = _UNSAFE.sub(
        lambda m: f"\\u{ord(m.group()):04x}" if ord(m.group()) > 0xFF else f"\\x{ord(m.group()):02x}", value
    )
    return html.escape(value, quote=True)


def num(n) -> str:
    return "" if n is None else f"{n:,}"


# -- gathering -------------------------------------------------------------------------------------


@dataclass
class StoreFile:
    file: str
    store: str | None = None
    size: int = 0
    live_bytes: int | None = None
    garbage_bytes: int | None = None
    entries: list = field(default_factory=list)  # [start, end, category, Counter(kind)] runs, merged
    holes: list = field(default_factory=list)

    @staticmethod
    def _add(runs: list, start: int, length: int, kind: str) -> None:
        cat = CATEGORY.get(kind, "garbage")
        end = start + max(length or 0, 0)
        if runs and runs[-1][2] == cat and runs[-1][1] == start:
            runs[-1][1] = end
            runs[-1][3][kind] += 1
        else:
            runs.append([start, end, cat, Counter({kind: 1})])

    def segments(self) -> list[tuple[int, int, str, Counter]]:
        """Disjoint byte ranges in file order: store entries, and holes where no entry is."""
        entries = sorted(self.entries, key=lambda r: r[0])
        out = [tuple(r) for r in entries]
        covered = _union([(r[0], r[1]) for r in entries])
        for start, end, cat, kinds in sorted(self.holes, key=lambda r: r[0]):
            for s, e in _subtract((start, end), covered):
                out.append((s, e, cat, kinds))
        return sorted(out, key=lambda r: r[0])


def _union(ranges):
    out = []
    for s, e in sorted(ranges):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _subtract(rng, covered):
    """``rng`` minus the sorted disjoint ``covered`` ranges."""
    import bisect

    s, e = rng
    out = []
    i = max(bisect.bisect_right([c[0] for c in covered], s) - 1, 0)
    for cs, ce in covered[i:]:
        if cs >= e:
            break
        if ce <= s:
            continue
        if cs > s:
            out.append((s, cs))
        s = max(s, ce)
        if s >= e:
            break
    if s < e:
        out.append((s, e))
    return out


@dataclass
class QueueRow:
    queue: str | None
    levels: int = 0
    index_versions: set = field(default_factory=set)
    durable_known: bool = True
    name_sources: set = field(default_factory=set)
    messages: int = 0
    bytes: int = 0
    predicted: int = 0
    dropped: int = 0
    reasons: Counter = field(default_factory=Counter)
    crash: str | None = None
    bounds: tuple[int, int] | None = None  # (at least, at most) when the vhost's store can crash while serving
    queue_type: str = "classic"  # classic / quorum / stream
    amqp091_lost: int = 0  # stream records kept that an AMQP 0-9-1 consumer is not served


@dataclass
class Vhost:
    name: str | None
    recovery: str | None = None
    files: dict = field(default_factory=dict)  # file -> StoreFile
    queues: dict = field(default_factory=dict)  # queue name -> QueueRow
    findings: list = field(default_factory=list)


@dataclass
class Node:
    verdict: object  # fsck.NodeVerdict
    vhosts: dict = field(default_factory=dict)  # vhost name (None: node-level findings) -> Vhost

    def vhost(self, name) -> Vhost:
        name = display(name)
        if name not in self.vhosts:
            self.vhosts[name] = Vhost(name)
        return self.vhosts[name]

    @property
    def findings(self):
        return [f for v in self.vhosts.values() for f in v.findings]

    @property
    def queues(self):
        return [q for v in self.vhosts.values() for q in v.queues.values()]

    def worst(self) -> str | None:
        sev = [f.severity for f in self.findings]
        return max(sev, key=SEVERITY_RANK.__getitem__) if sev else None


#: what a report reads, each once: fsck, then these tables (a progress display counts passes)
TABLES = ("files", "store", "holes", "queues", "messages")


def gather(
    paths, broker_version=None, as_of=None, vhosts=None, progress=None, jobs: int = 1
) -> tuple[list[Node], dict]:
    """Everything the page shows, read once per table (as_of pinned, so every table and fsck
    judge TTLs at the same instant). ``progress``: a display ``(text, done, total)``."""
    from cqforensics.model.options import make_options
    from cqforensics.read import driver
    from cqforensics.read.driver import Progress

    given = as_of is not None
    if as_of is None:
        as_of = int(dt.datetime.now(dt.UTC).timestamp() * 1000)
    opts = {
        "as_of": as_of,
        **({"broker_version": broker_version} if broker_version else {}),
        **({"vhosts": vhosts} if vhosts else {}),
    }
    if progress is not None:
        opts["progress"] = Progress.of(progress, passes=1 + len(TABLES))
    # the nodes listed and their metadata read once, for fsck and every table read
    scans = driver.open_nodes(paths, make_options(broker_version, as_of, bodies=False, decode=False, jobs=jobs))
    # no provenance record: the page shows none, and it would hash every input file
    report = fsck_mod.run(paths, jobs=jobs, scans=scans, record=False, **{k: v for k, v in opts.items()})
    report.as_of_given = given
    nodes = {display(n.node): Node(n) for n in report.nodes}

    def node(label) -> Node:
        # every label through ``display``: fsck's queue verdicts may carry a node name's raw
        # (surrogate-escaped) form where the tables carry its display form
        label = display(label)
        if label not in nodes:  # a node the tables name but fsck did not (should not happen)
            nodes[label] = Node(fsck_mod.NodeVerdict(label, label, "?", "?", {}, "?"))
        return nodes[label]

    for n in nodes.values():
        for vh, mode in n.verdict.vhost_recovery.items():
            n.vhost(vh).recovery = mode
    for f in report.findings:
        node(f.node).vhost(f.vhost).findings.append(f)
    for q in report.queues:
        row = node(q.node).vhost(q.vhost).queues.setdefault(display(q.queue), QueueRow(display(q.queue)))
        row.crash = q.crash
        if (q.predicted_min, q.predicted_max) != (q.predicted_after_restart,) * 2:
            row.bounds = (q.predicted_min, q.predicted_max)

    def batches(table, columns):
        for b in api.iter_batches(scans, table, columns=columns, jobs=jobs, **opts):  # progress: one pass each
            d = b.to_pydict()
            yield from zip(*(d[c] for c in columns))

    for n, vh, file, kind, size, live, garbage in batches(
        "files", ["node", "vhost", "file", "kind", "size", "live_bytes", "garbage_bytes"]
    ):
        if kind == "rdq":
            node(n).vhost(vh).files[file] = StoreFile(file, None, size or 0, live, garbage)
    for n, vh, store, file, offset, size, status in batches(
        "store", ["node", "vhost", "store", "file", "offset", "total_size", "status"]
    ):
        sf = node(n).vhost(vh).files.setdefault(file, StoreFile(file))
        sf.store = store
        StoreFile._add(sf.entries, offset or 0, size or 0, status or "corrupt")
    for n, vh, store, file, offset, length, kind in batches(
        "holes", ["node", "vhost", "store", "file", "offset", "length", "kind"]
    ):
        if store == "queue":
            continue  # .qs files: not part of the shared-store map
        sf = node(n).vhost(vh).files.setdefault(file, StoreFile(file))
        sf.store = sf.store or store
        StoreFile._add(sf.holes, offset or 0, length or 0, kind or "garbage")
    for n, vh, q, index_version, durable_known, name_source, messages, nbytes, queue_type in batches(
        "queues",
        ["node", "vhost", "queue", "index_version", "durable_known", "name_source", "messages", "bytes", "queue_type"],
    ):
        row = node(n).vhost(vh).queues.setdefault(q, QueueRow(q))
        row.queue_type = queue_type or row.queue_type
        row.levels += 1
        row.index_versions.add(index_version)
        row.durable_known = row.durable_known and bool(durable_known)
        row.name_sources.add(name_source)
        row.messages += messages or 0
        row.bytes += nbytes or 0
    for n, vh, q, survives, reason, amqp091 in batches(
        "messages", ["node", "vhost", "queue", "survives_restart", "drop_reason", "amqp091_drop_reason"]
    ):
        row = node(n).vhost(vh).queues.setdefault(q, QueueRow(q))
        if survives:
            row.predicted += 1
            row.amqp091_lost += amqp091 is not None
        else:
            row.dropped += 1
            row.reasons[reason or "unknown"] += 1
    meta = {
        "as_of": as_of,
        "broker_version": broker_version,
        "paths": paths,
        "summary": report.summary(),
        "exit_code": report.exit_code,
    }
    return list(nodes.values()), meta


# -- rendering -------------------------------------------------------------------------------------

CSS = """
:root{--live:#3a9d5d;--orphan:#e3a21a;--garbage:#d0453a;--hole:#6c6f93;--none:#e6e6e6;--ok:#3a9d5d;
--error:#c62828;--warning:#d9822b;--info:#4a78b5;font-family:system-ui,-apple-system,"Segoe UI",sans-serif}
body{margin:0 auto;max-width:1200px;padding:16px 24px;color:#222;background:#fafafa;font-size:14px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:19px;margin:28px 0 6px;border-bottom:2px solid #ccc;padding-bottom:4px}
h3{font-size:16px;margin:18px 0 6px}h4{font-size:14px;margin:14px 0 4px;color:#444}
.meta{color:#555;margin:2px 0}code,.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px}
table{border-collapse:collapse;width:100%;background:#fff;margin:4px 0 8px}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f0f0f0;font-weight:600}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
.sev{display:inline-block;border-radius:3px;padding:0 5px;color:#fff;font-size:12px;font-weight:600}
.sev-error{background:var(--error)}.sev-warning{background:var(--warning)}.sev-info{background:var(--info)}
.sev-none{background:var(--ok)}
.vhost{background:#fff;border:1px solid #ddd;border-radius:6px;padding:4px 14px 10px;margin:10px 0}
.file{margin:6px 0 10px}.fname{display:flex;justify-content:space-between;gap:12px}
svg.store-bar{display:block;width:100%;height:18px;background:var(--none);border:1px solid #bbb}
svg.depth{display:block;width:160px;height:12px;background:var(--none)}
.seg-live{fill:var(--live)}.seg-orphan{fill:var(--orphan)}.seg-garbage{fill:var(--garbage)}.seg-hole{fill:var(--hole)}
.seg-delivered{fill:var(--live)}.seg-dropped{fill:var(--garbage)}
.legend span{display:inline-block;margin-right:14px}.sw{display:inline-block;width:11px;height:11px;
vertical-align:-1px;margin-right:4px;border:1px solid #999}
.sw-live{background:var(--live)}.sw-orphan{background:var(--orphan)}.sw-garbage{background:var(--garbage)}
.sw-hole{background:var(--hole)}.sw-none{background:var(--none)}
.reason{display:inline-block;background:#fbe3e1;border:1px solid #e8b4ae;border-radius:3px;padding:0 4px;margin:1px 2px}
.crash{color:var(--error);font-weight:600}.dim{color:#777}
details.finding-group{background:#fff;border:1px solid #ddd;border-radius:4px;margin:4px 0;padding:2px 8px}
details.finding-group>summary{cursor:pointer;padding:3px 0}
"""


def _sev(sev: str | None) -> str:
    return f'<span class="sev sev-{text(sev or "none")}">{text(sev or "none")}</span>'


def _rel(path: str | None, base: str) -> str:
    """A file path shown relative to its node dir (the full one in a tooltip)."""
    if not path:
        return ""
    shown = path
    if base and (path + "/").startswith(base.rstrip("/") + "/"):
        shown = path[len(base.rstrip("/")) + 1 :] or PurePosixPath(path).name
    return f'<span class="mono" title="{text(path)}">{text(shown)}</span>'


def _store_bar(sf: StoreFile) -> str:
    size = max(sf.size, max((s[1] for s in sf.entries + sf.holes), default=0))
    segs = sf.segments()
    totals = Counter()
    for s, e, cat, _ in segs:
        totals[cat] += e - s
    coarse = len(segs) > MAX_RECTS
    rects = []
    if size > 0:
        if coarse:
            step = size / COARSE_SLICES
            buckets = [Counter() for _ in range(COARSE_SLICES)]
            for s, e, cat, _ in segs:
                i = min(int(s / step), COARSE_SLICES - 1)
                while s < e and i < COARSE_SLICES:
                    cut = min(e, (i + 1) * step)
                    buckets[i][cat] += cut - s
                    s, i = cut, i + 1
            parts = [
                (
                    i * step,
                    (i + 1) * step,
                    b.most_common(1)[0][0],
                    Counter({f"{c} bytes": int(v) for c, v in b.items()}),
                )
                for i, b in enumerate(buckets)
                if b
            ]
        else:
            parts = segs
        for s, e, cat, kinds in parts:
            x, w = BAR_UNITS * s / size, max(BAR_UNITS * (e - s) / size, 0.6)
            what = ", ".join(f"{k} x{v}" if not coarse else f"{k}: {v:,}" for k, v in sorted(kinds.items()))
            tip = f"{cat}: bytes {int(s):,} .. {int(e):,} ({int(e - s):,} bytes; {what})"
            rects.append(
                f'<rect class="seg seg-{cat}" data-kind="{cat}" data-offset="{int(s)}" '
                f'data-length="{int(e - s)}" x="{x:.2f}" y="0" width="{w:.2f}" height="10">'
                f"<title>{text(tip)}</title></rect>"
            )
    parts_text = " ".join(
        f'<span><i class="sw sw-{c}"></i>{c} {num(totals[c])} B</span>' for c in CATEGORIES if totals[c]
    )
    note = f' <span class="dim">(coarsened: {COARSE_SLICES} slices, each its dominant kind)</span>' if coarse else ""
    return (
        f'<svg class="store-bar" data-file="{text(sf.file)}" data-size="{size}" viewBox="0 0 {BAR_UNITS} 10" '
        f'preserveAspectRatio="none" role="img" aria-label="{text(PurePosixPath(sf.file).name)}">'
        f'{"".join(rects)}</svg><div class="legend dim">{parts_text or "empty file"}{note}</div>'
    )


def _store_section(v: Vhost, node_path: str) -> str:
    out = [
        "<h4>Shared-store files</h4>",
        '<div class="legend">'
        + "".join(f'<span title="{text(CATEGORY_HELP[c])}"><i class="sw sw-{c}"></i>{c}</span>' for c in CATEGORIES)
        + '<span><i class="sw sw-none"></i>not covered by any entry</span></div>',
    ]
    if not v.files:
        out.append('<p class="dim">no shared-store files</p>')
    for sf in sorted(v.files.values(), key=lambda f: (f.store or "", _file_number(f.file), f.file)):
        path = PurePosixPath(sf.file)
        store = sf.store or path.parent.name.removeprefix("msg_store_")
        out.append(
            f'<div class="file" data-store="{text(store)}"><div class="fname"><span class="mono fpath" '
            f'title="{text(sf.file)}">{text(path.parent.name + "/" + path.name)}</span><span class="dim">'
            f"{text(store)} store · {num(sf.size)} bytes"
            + (f" · live {num(sf.live_bytes)} · garbage {num(sf.garbage_bytes)}" if sf.live_bytes is not None else "")
            + f"</span></div>{_store_bar(sf)}</div>"
        )
    return "".join(out)


def _file_number(path: str) -> int:
    stem = PurePosixPath(path).stem
    return int(stem) if stem.isdigit() else -1


def _queue_section(v: Vhost) -> str:
    if not v.queues:
        return '<h4>Queues</h4><p class="dim">no queues</p>'
    deepest = max((q.messages for q in v.queues.values()), default=0) or 1
    rows = []
    for q in sorted(v.queues.values(), key=lambda q: (q.queue is None, q.queue or "")):
        held = max(q.messages, q.predicted + q.dropped)
        w_ok, w_drop = 160 * q.predicted / deepest, 160 * q.dropped / deepest
        bar = (
            f'<svg class="depth" viewBox="0 0 160 12" role="img" aria-label="depth">'
            f'<rect class="seg seg-delivered" x="0" y="0" width="{w_ok:.2f}" height="12"><title>{num(q.predicted)} '
            f'delivered</title></rect><rect class="seg seg-dropped" x="{w_ok:.2f}" y="0" width="{w_drop:.2f}" '
            f'height="12"><title>{num(q.dropped)} dropped</title></rect></svg>'
        )
        reasons = " ".join(
            f'<span class="reason" data-reason="{text(r)}">{text(r)} ×{num(c)}</span>'
            for r, c in sorted(q.reasons.items(), key=lambda rc: (-rc[1], rc[0]))
        )
        notes = []
        if not q.durable_known:
            notes.append("not in the durable-queue metadata (deleted at boot)")
        if q.name_sources - {".queue_name", "ra_config"}:
            notes.append("name from " + ", ".join(sorted(str(s) for s in q.name_sources if s)))
        if q.crash:
            notes.append(f'<span class="crash">crash: {text(q.crash)}</span>')
        if q.bounds is not None:
            notes.append(
                f"delivers {num(q.bounds[0])} to {num(q.bounds[1])}, depending on timing: the vhost's message "
                "store can crash while it serves (store-crash)"
            )
        if q.amqp091_lost:
            notes.append(f"{num(q.amqp091_lost)} not served to an AMQP 0-9-1 consumer (see stream-not-served)")
        versions = ", ".join(f"v{x}" for x in sorted(i for i in q.index_versions if i is not None))
        if q.queue_type != "classic":
            versions = q.queue_type + (" (Ra log)" if q.queue_type == "quorum" else "")
        rows.append(
            f'<tr class="queue-row" data-queue="{text(q.queue)}" data-type="{text(q.queue_type)}"><td class="qname mono">{text(q.queue)}</td>'
            f"<td>{text(versions)}{' · ' + str(q.levels) + ' levels' if q.levels > 1 else ''}</td>"
            f'<td class="n messages">{num(held)}</td><td class="n delivered">{num(q.predicted)}</td>'
            f'<td class="n dropped">{num(q.dropped)}</td><td>{bar}</td><td class="reasons">{reasons}'
            f"{'<br>' if reasons and notes else ''}{'; '.join(n if n.startswith('<') else text(n) for n in notes)}"
            f"</td></tr>"
        )
    return (
        '<h4>Queues</h4><table class="queues"><thead><tr><th>queue</th><th>index</th><th class="n">messages</th>'
        '<th class="n">delivered at next boot</th><th class="n">dropped</th><th>depth</th>'
        "<th>drop reasons / notes</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )


def _findings_section(findings, node_path: str) -> str:
    if not findings:
        return '<h4>Findings</h4><p class="dim">no findings</p>'
    groups = defaultdict(list)
    for f in findings:
        groups[f.code].append(f)
    out = ["<h4>Findings</h4>"]
    for code, fs in sorted(groups.items(), key=lambda cf: (-max(SEVERITY_RANK[f.severity] for f in cf[1]), cf[0])):
        sev = max((f.severity for f in fs), key=SEVERITY_RANK.__getitem__)
        meaning = CODES.get(code, ("", ""))[1]
        rows = []
        for f in sorted(fs, key=lambda f: (f.queue or "", f.file or "", f.offset or 0))[:MAX_FINDINGS_SHOWN]:
            queue = f.queue if f.priority is None else f"{f.queue} [p{f.priority}]"
            rows.append(
                f'<tr class="finding" data-code="{text(code)}">'
                f'<td>{_sev(f.severity)}</td><td class="mono">{text(queue)}</td><td>{_rel(f.file, node_path)}'
                f'</td><td class="n offset">{num(f.offset)}</td><td>{text(f.message)}</td></tr>'
            )
        more = len(fs) - MAX_FINDINGS_SHOWN
        out.append(
            f'<details class="finding-group" data-code="{text(code)}" open><summary>{_sev(sev)} '
            f'<code>{text(code)}</code> ×<span class="count">{len(fs)}</span> '
            f'<span class="dim">{text(meaning)}</span></summary>'
            '<table><thead><tr><th>severity</th><th>queue</th><th>file</th><th class="n">offset</th>'
            "<th>message</th></tr></thead><tbody>"
            + "".join(rows)
            + "</tbody></table>"
            + (
                f'<p class="dim">{more:,} more not shown (cqforensics fsck --json lists them all)</p>'
                if more > 0
                else ""
            )
            + "</details>"
        )
    return "".join(out)


def _node_totals(n: Node) -> dict:
    qs = n.queues
    return {
        "messages": sum(max(q.messages, q.predicted + q.dropped) for q in qs),
        "predicted": sum(q.predicted for q in qs),
        "dropped": sum(q.dropped for q in qs),
        "findings": Counter(f.severity for f in n.findings),
    }


def _fleet(nodes: list[Node]) -> str:
    rows = []
    for i, n in enumerate(nodes, 1):
        v, t = n.verdict, _node_totals(n)
        wb = v.written_by or {}
        f = t["findings"]
        rows.append(
            f'<tr class="fleet-row" data-node="{text(v.node)}"><td><a href="#node-{i}" class="mono">'
            f'{text(v.node)}</a></td><td class="version">{text(wb.get("label") or v.broker_version)}</td>'
            f'<td class="predicted-for">{text(v.broker_version)}'
            f"{' (assumed)' if getattr(v, 'broker_version_assumed', False) else ''}</td><td>{text(v.boot)}</td>"
            f'<td class="n messages">{num(t["messages"])}</td><td class="n delivered">{num(t["predicted"])}</td>'
            f'<td class="n dropped">{num(t["dropped"])}</td><td class="worst">{_sev(n.worst())}</td>'
            f'<td class="n">{num(f["error"])} / {num(f["warning"])} / {num(f["info"])}</td>'
            f'<td class="not-read">{text(", ".join(u["kind"] for u in getattr(v, "not_read", ())))}</td></tr>'
        )
    return (
        '<section id="fleet"><h2>Fleet summary</h2><table class="fleet"><thead><tr><th>node</th>'
        '<th>written by (inferred)</th><th>predicted for</th><th>boot</th><th class="n">messages</th>'
        '<th class="n">delivered at next boot</th><th class="n">predicted drops</th><th>worst</th>'
        '<th class="n">errors / warnings / info</th><th>not read</th></tr></thead><tbody>'
        + "".join(rows)
        + "</tbody></table></section>"
    )


def _predicted_for(v) -> str:
    """Which version the next boot is predicted for, and on what ground: named, inferred, or
    assumed (the data allows more than one series) with how to name the real one."""
    wb = v.written_by or {}
    if not getattr(v, "version_inferred", True):
        return "named by --broker-version"
    if getattr(v, "broker_version_assumed", False):
        return (
            f'<span class="assumed">assumed</span>: the newest version that could have written the data; if '
            f"another will boot it, name it (<code>--broker-version {text(wb.get('low') or '3.10')}</code>)"
        )
    return "the series that wrote the data (inferred)"


def _not_read(v) -> str:
    """The kinds of queue storage the node holds that were not read, with their queues."""
    out = []
    for u in getattr(v, "not_read", ()):
        names = ", ".join(
            f'<span class="mono">{text(q["queue"])}</span> (vhost <span class="mono">{text(q["vhost"])}</span>)'
            for q in u["queues"][:50]
        )
        more = f" and {num(len(u['queues']) - 50)} more" if len(u["queues"]) > 50 else ""
        kind = STORAGE_KINDS.get(u["kind"])
        out.append(
            f'<p class="meta not-read" data-kind="{text(u["kind"])}"><b class="crash">not read</b>: '
            f"{text(plural(len(u['queues']), kind.noun if kind else u['kind']))}"
            f"{': ' + names + more if names else ''} ({text(plural(u['data_dirs'], 'data dir'))}, "
            f'{num(u["bytes"])} bytes under <span class="mono">{text(u["path"])}</span>): cqforensics does not '
            "read them yet; their messages are in none of these counts</p>"
        )
    return "".join(out)


def _node(i: int, n: Node) -> str:
    v, t = n.verdict, _node_totals(n)
    wb = v.written_by or {}
    why = "; ".join(wb.get("why") or [])
    out = [
        f'<section class="node" id="node-{i}" data-node="{text(v.node)}"><h2>Node <span class="mono node-name">'
        f"{text(v.node)}</span> {_sev(n.worst())}</h2>",
        f'<p class="meta">path <span class="mono">{text(v.path)}</span></p>',
        f'<p class="meta">written by <b>{text(wb.get("label") or "?")}</b>'
        f"{' <span class=dim>(inferred: ' + text(why) + ')</span>' if why else ''}</p>",
        f'<p class="meta predicted-for">next boot predicted for <b>{text(v.broker_version)}</b> ({_predicted_for(v)})'
        f" · boot <b>{text(v.boot)}</b> · {text(plural(t['messages'], 'message'))}, {num(t['predicted'])} delivered, "
        f"<b>{num(t['dropped'])}</b> dropped</p>",
        _not_read(v),
    ]
    for w in v.warnings:
        out.append(f'<p class="meta crash">{text(w)}</p>')
    for name, vh in sorted(n.vhosts.items(), key=lambda kv: (kv[0] is None, kv[0] or "")):
        if name is None:
            continue
        out.append(
            f'<section class="vhost" data-vhost="{text(name)}"><h3>vhost <span class="mono vhost-name">'
            f'{text(name)}</span> <span class="dim">recovery: {text(vh.recovery or "?")}</span></h3>'
        )
        out.append(_store_section(vh, v.path))
        out.append(_queue_section(vh))
        out.append(_findings_section(vh.findings, v.path))
        out.append("</section>")
    if None in n.vhosts and n.vhosts[None].findings:
        out.append(
            '<section class="vhost node-level"><h3>Node-wide</h3>'
            + _findings_section(n.vhosts[None].findings, v.path)
            + "</section>"
        )
    out.append("</section>")
    return "".join(out)


def _ttls(meta: dict) -> str:
    """When TTLs were judged, and how many messages that made expired."""
    s = meta["summary"]
    when = dt.datetime.fromtimestamp(meta["as_of"] / 1000, dt.UTC).isoformat(timespec="seconds")
    n = s.get("expired", 0)
    if s.get("ttls_judged_by") == "as_of":
        return f"TTLs judged at {text(when)} (--as-of): {num(n)} expired"
    return f'TTLs judged by the clock, at {text(when)} (now): <b class="expired">{num(n)}</b> expired by it' + (
        " (<code>--as-of TIME</code> judges them at another time, e.g. when the node stopped)" if n else ""
    )


def render(paths, broker_version: str | None = None, as_of=None, vhosts=None, progress=None, jobs: int = 1) -> str:
    """The report of every node dir under ``paths``, as one self-contained HTML page.
    ``progress``: a display ``(text, done, total)``; ``jobs``: processes reading at once (the
    same page)."""
    from cqforensics import __version__
    from cqforensics.model.options import parse_as_of

    nodes, meta = gather(paths, broker_version, parse_as_of(as_of, "as_of"), vhosts, progress, jobs)
    shown = [paths] if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__") else list(paths)
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    s = meta["summary"]
    head = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>cqforensics report</title><style>" + CSS + "</style></head><body>"
    )
    top = (
        '<header><h1>cqforensics report</h1><p class="meta">inputs: '
        + ", ".join(f'<span class="mono">{text(display(p))}</span>' for p in shown)
        + f'</p><p class="meta">{text(plural(len(nodes), "node"))} · {text(plural(s["queues"], "queue"))} · '
        f"{text(plural(s['messages'], 'message'))} · "
        f'<b>{num(s["dropped"])}</b> predicted drops · <span class="ttls">{_ttls(meta)}</span> · generated '
        f"{text(now)} by cqforensics {text(__version__)}"
        + (f" · predicted for {text(broker_version)} (--broker-version)" if broker_version else "")
        + "</p>"
        + (
            f'<p class="meta crash incomplete">incomplete: {text(" and ".join(s["not_read"]))} storage not read '
            "(see each node)</p>"
            if s.get("not_read")
            else ""
        )
        + "</header>"
    )
    body = [_fleet(nodes)] if len(nodes) > 1 else []
    if not nodes:
        body.append("<p>No node dir found.</p>")
    body += [_node(i, n) for i, n in enumerate(nodes, 1)]
    return head + top + "".join(body) + "</body></html>\n"


__all__ = ["render", "gather", "text"]
