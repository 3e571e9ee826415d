"""``cqforensics report PATH --html OUT.html``: one self-contained page, checked in a real browser.

The page is rendered from a real sample (and from a folder holding two) and loaded by headless
Chromium (Debian's ``chromium``; ``.ci/run`` installs it): ``--dump-dom`` gives the document as
the browser built it, and the tests assert on what it shows (node and queue names, counts,
finding codes with offsets, the SVG bars of the store files) against the library's own tables;
``--screenshot`` renders it to a PNG. Hostile names (``<script>``, non-UTF-8 bytes, bidi
overrides) must come out as text. Without chromium the browser tests skip (fail under
CQF_NO_SKIP=1); the output-path rules and the escaping are checked without it.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from collections import Counter, defaultdict
from html.parser import HTMLParser
from pathlib import Path

import pytest

import cqforensics
from cli.main import main
from cqforensics.base.findings import SEVERITY_RANK
from cqforensics.codecs.textfiles import queue_dir_name, vhost_dir_name
from cqforensics.commands import fsck, report
from support import SAMPLES, skip_or_fail

AS_OF = "2030-01-01T00:00:00Z"  # pinned: the TTL verdicts of page and tables agree
SAMPLE = SAMPLES / "4.3.6-kill"


# -- a headless browser --------------------------------------------------------------------------------


def chromium_exe() -> str:
    for name in ("chromium", "chromium-browser"):
        exe = shutil.which(name)
        if exe:
            return exe
    skip_or_fail("headless Chromium is not installed (apt-get install chromium; .ci/run installs it)")


def chromium(page: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """Run headless Chromium on ``page`` (a file:// URL) with a private profile, no network
    services and no sandbox when root (Chromium refuses to run sandboxed as root)."""
    cmd = [
        chromium_exe(),
        "--headless",
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--disable-sync",
        "--disable-background-networking",
        "--disable-component-update",
        "--hide-scrollbars",
        f"--user-data-dir={tmp / 'chromium-profile'}",
        *(["--no-sandbox"] if os.geteuid() == 0 else []),
        *args,
        page.absolute().as_uri(),
    ]
    p = subprocess.run(cmd, capture_output=True, timeout=180)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-3000:]
    return p


class Element:
    def __init__(self, tag: str, attrs: dict, parent: Element | None):
        self.tag, self.attrs, self.parent, self.children = tag, attrs, parent, []

    @property
    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def iter(self):
        for c in self.children:
            if isinstance(c, Element):
                yield c
                yield from c.iter()

    def all(self, tag: str | None = None, cls: str | None = None) -> list[Element]:
        return [e for e in self.iter() if (tag is None or e.tag == tag) and (cls is None or cls in e.classes)]

    def one(self, tag: str | None = None, cls: str | None = None) -> Element:
        found = self.all(tag, cls)
        assert len(found) == 1, (tag, cls, len(found))
        return found[0]


class Dom(HTMLParser):
    """The element tree of the serialized DOM Chromium dumps (HTML syntax)."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.root = self.cur = Element("#document", {}, None)
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        e = Element(tag, dict(attrs), self.cur)
        self.cur.children.append(e)
        if tag not in self.VOID:
            self.cur = e

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Element(tag, dict(attrs), self.cur))

    def handle_endtag(self, tag):
        e = self.cur
        while e is not None and e.tag != tag:
            e = e.parent
        if e is not None and e.parent is not None:
            self.cur = e.parent

    def handle_data(self, data):
        self.cur.children.append(data)


def shown(page: Path, tmp: Path) -> Element:
    """The document as headless Chromium built it from ``page``."""
    return Dom(chromium(page, tmp, "--dump-dom").stdout.decode("utf-8")).root


def write_report(paths, out: Path, *extra: str) -> Path:
    rc = main(["report", *map(str, paths), "--html", str(out), "--as-of", AS_OF, *extra])
    assert rc == 0
    return out


def cell(row: Element, cls: str) -> str:
    return row.one("td", cls).text().strip()


def number(text: str) -> int:
    return int(text.replace(",", ""))


# -- expectations from the library's own tables --------------------------------------------------------


def expected_queues(path) -> dict:
    """(node, vhost, queue) -> (messages, delivered, dropped, Counter of drop reasons)."""
    out = defaultdict(lambda: [0, 0, 0, Counter()])
    for m in cqforensics.read_table(
        path, "messages", columns=["node", "vhost", "queue", "survives_restart", "drop_reason"], as_of=AS_OF
    ).to_pylist():
        e = out[(m["node"], m["vhost"], m["queue"])]
        e[0] += 1
        if m["survives_restart"]:
            e[1] += 1
        else:
            e[2] += 1
            e[3][m["drop_reason"]] += 1
    for q in cqforensics.read_table(path, "queues", columns=["node", "vhost", "queue"]).to_pylist():
        out[(q["node"], q["vhost"], q["queue"])]  # queues holding nothing are listed too
    return out


def store_bytes(path) -> dict:
    """file -> {category: bytes} of the store entries (live, orphan)."""
    out = defaultdict(Counter)
    for e in cqforensics.read_table(path, "store", columns=["file", "total_size", "status"]).to_pylist():
        out[e["file"]][report.CATEGORY[e["status"]]] += e["total_size"]
    return out


@pytest.fixture(scope="module")
def single_page(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report-single")
    return write_report([SAMPLE], tmp / "report.html"), tmp


@pytest.fixture(scope="module")
def single(single_page):
    page, tmp = single_page
    return page, shown(page, tmp), tmp


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report-fleet")
    folder = tmp / "backups"
    for name in ("4.3.6-kill", "3.10.8-kill"):
        shutil.copytree(SAMPLES / name / "mnesia", folder / name / "mnesia", symlinks=True)
    page = write_report([folder], tmp / "fleet.html")
    return folder, page, shown(page, tmp), tmp


# -- the page ------------------------------------------------------------------------------------------


def test_the_page_is_self_contained(single_page):
    page, _ = single_page
    html = page.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>")
    low = html.lower()
    for needle in ("http:", "https:", "<script", "<link", "<iframe", "<object", " src=", "url(", "@import"):
        assert needle not in low, needle
    assert "content-security-policy" in low and "default-src 'none'" in html  # no load, no script, whatever the data


def test_the_browser_shows_nodes_vhosts_and_queues_with_their_counts(single):
    _, dom, _ = single
    assert dom.one("head").one("title").text() == "cqforensics report"
    assert not dom.all(cls="fleet-row")  # one node: no fleet summary
    node = dom.one("section", "node")
    assert node.one(cls="node-name").text() == "rabbit@localhost"
    assert "4.3.1 - 4.3.x" in node.text()  # the version inferred from the data
    vhosts = {v.attrs["data-vhost"]: v for v in node.all("section", "vhost")}
    assert set(vhosts) == {"/", "staging/ü"}
    assert {v.one(cls="vhost-name").text() for v in vhosts.values()} == {"/", "staging/ü"}

    want = expected_queues(SAMPLE)
    seen = {}
    for vname, v in vhosts.items():
        for row in v.all("tr", "queue-row"):
            reasons = Counter(
                {r.attrs["data-reason"]: number(r.text().rsplit("×", 1)[1]) for r in row.all("span", "reason")}
            )
            seen[("rabbit@localhost", vname, cell(row, "qname"))] = [
                number(cell(row, "messages")),
                number(cell(row, "delivered")),
                number(cell(row, "dropped")),
                reasons,
            ]
            depth = row.one("svg", "depth")
            assert {r.attrs["class"] for r in depth.all("rect")} == {"seg seg-delivered", "seg seg-dropped"}
    assert seen == {k: list(v) for k, v in want.items()}
    # what the sample is known to hold (manifest scenario): drops for the reasons the broker has
    assert seen[("rabbit@localhost", "/", "transient.mix")][3] == {"transient": 6}
    assert seen[("rabbit@localhost", "/", "session.exclusive")][3] == {"queue_deleted": 5}
    assert sum(v[2] for v in seen.values()) > 0


def test_the_browser_shows_findings_grouped_by_code_with_file_and_offset(single):
    _, dom, _ = single
    rep = fsck.run([SAMPLE], as_of=AS_OF)
    for v in dom.all("section", "vhost"):
        vname = v.attrs.get("data-vhost")
        want = Counter(f.code for f in rep.findings if f.vhost == vname)
        groups = {g.attrs["data-code"]: g for g in v.all("details", "finding-group")}
        assert {c: number(g.one("span", "count").text()) for c, g in groups.items()} == want
        # worst first
        ranks = [
            max(SEVERITY_RANK[f.severity] for f in rep.findings if f.vhost == vname and f.code == c) for c in groups
        ]
        assert ranks == sorted(ranks, reverse=True)
        for f in rep.findings:
            if f.vhost != vname:
                continue
            rows = groups[f.code].all("tr", "finding")
            files = [r.all("td")[2].one("span").attrs["title"] for r in rows]
            assert f.file in files
            if f.offset is not None:
                assert f"{f.offset:,}" in [cell(r, "offset") for r in rows]
    orphan = [g for g in dom.all("details", "finding-group") if g.attrs["data-code"] == "orphan-message"]
    assert orphan and cell(orphan[0].all("tr", "finding")[0], "offset")  # an offset is shown


def test_the_browser_shows_one_svg_bar_per_store_file(single):
    _, dom, _ = single
    files = [
        f["file"]
        for f in cqforensics.read_table(SAMPLE, "files", columns=["file", "kind"]).to_pylist()
        if f["kind"] == "rdq"
    ]
    bars = {b.attrs["data-file"]: b for b in dom.all("svg", "store-bar")}
    assert sorted(bars) == sorted(files)
    want = store_bytes(SAMPLE)
    assert any(want[f]["orphan"] for f in files)  # the sample has orphans: the map must show them
    for f in files:
        bar = bars[f]
        size = int(bar.attrs["data-size"])
        got = Counter()
        end = 0
        for r in bar.all("rect"):
            kind, off, length = r.attrs["data-kind"], int(r.attrs["data-offset"]), int(r.attrs["data-length"])
            assert kind in report.CATEGORIES and off >= end  # disjoint, in file order
            end = off + length
            x, w = float(r.attrs["x"]), float(r.attrs["width"])
            assert 0 <= x <= 1000 and 0 < w and x + w <= 1000.7
            assert r.one("title").text().startswith(kind)
            got[kind] += length
        assert end <= size
        for kind in ("live", "orphan"):
            assert got[kind] == want[f][kind], (f, kind)
        if size:
            assert got["live"] + got["orphan"] + got["garbage"] + got["hole"] == size


def test_a_screenshot_renders(single):
    page, _, tmp = single
    png = tmp / "report.png"
    chromium(page, tmp, f"--screenshot={png}", "--window-size=1200,1400")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (1200, 1400)
    assert len(data) > 20_000  # not a blank page


def test_a_folder_of_nodes_gets_a_fleet_summary(fleet):
    folder, _, dom, _ = fleet
    rep = fsck.run([folder], as_of=AS_OF)
    want = expected_queues(folder)
    summary = [s for s in dom.all("section") if s.attrs.get("id") == "fleet"]
    assert len(summary) == 1 and summary[0].one("h2").text() == "Fleet summary"
    rows = {r.attrs["data-node"]: r for r in summary[0].one("table", "fleet").all("tr", "fleet-row")}
    assert sorted(rows) == sorted(n.node for n in rep.nodes) and len(rows) == 2
    assert {n.one(cls="node-name").text() for n in dom.all("section", "node")} == set(rows)
    for n in rep.nodes:
        row = rows[n.node]
        assert n.node.endswith("rabbit@localhost") and row.one("a").text() == n.node
        assert cell(row, "version") == n.written_by["label"]
        held = [v for k, v in want.items() if k[0] == n.node]
        assert number(cell(row, "messages")) == sum(v[0] for v in held)
        assert number(cell(row, "dropped")) == sum(v[2] for v in held) > 0
        worst = max((f.severity for f in rep.findings if f.node == n.node), key=SEVERITY_RANK.__getitem__)
        assert cell(row, "worst") == worst
    assert {cell(r, "version") for r in rows.values()} == {"3.10 - 3.12", "4.3.1 - 4.3.x"}


def test_each_node_is_listed_and_its_metadata_read_once_for_the_whole_page(tmp_path, monkeypatch):
    """fsck and the five table reads share one scan of each node (``driver.open_nodes``): at
    20,000 queue dirs each listing and metadata read costs seconds, and the page was six of each."""
    from cqforensics.discovery import nodes as layout
    from cqforensics.model import vhost as m_vhost

    folder = tmp_path / "backups"
    for name in ("4.3.6-kill", "3.10.8-kill"):
        shutil.copytree(SAMPLES / name / "mnesia", folder / name / "mnesia", symlinks=True)
    listed, read = Counter(), Counter()
    real_list, real_read = layout.read_node_dir, m_vhost.read_metadata

    def counted_list(path, *a, **kw):
        listed[str(path)] += 1
        return real_list(path, *a, **kw)

    def counted_read(path, *a, **kw):
        read[str(path)] += 1
        return real_read(path, *a, **kw)

    monkeypatch.setattr(layout, "read_node_dir", counted_list)
    monkeypatch.setattr(m_vhost, "read_metadata", counted_read)
    page = report.render([folder], as_of=AS_OF)
    assert "Fleet summary" in page
    assert len(listed) == 2 and set(listed.values()) == {1}
    assert len(read) == 2 and set(read.values()) == {1}


# -- hostile names -------------------------------------------------------------------------------------

HOSTILE_QUEUE = b"<script>alert('q')</script>\xfe\xff\"'&\xe2\x80\xae"
HOSTILE_VHOST = b"<b onmouseover=alert(2)>staging\xff</b>"
HOSTILE_NODE = b"rabbit@<img src=x onerror=alert(1)>\xff"


def hostile_copy(tmp: Path) -> Path:
    """A copy of the sample whose node dir, a vhost and a queue carry hostile names (the dirs
    renamed to the md5/base-36 of those names, so the names are taken as the broker's own)."""
    base = tmp / "hostile" / "mnesia"
    shutil.copytree(SAMPLE / "mnesia", base, symlinks=True)
    node = os.path.join(os.fsencode(base), HOSTILE_NODE)
    os.rename(os.path.join(os.fsencode(base), b"rabbit@localhost"), node)
    vhosts = os.path.join(node, b"msg_stores", b"vhosts")
    root_vhost = os.path.join(vhosts, vhost_dir_name(b"/").encode())
    queues = os.path.join(root_vhost, b"queues")
    old = os.path.join(queues, queue_dir_name(b"/", b"session.exclusive").encode())
    new = os.path.join(queues, queue_dir_name(b"/", HOSTILE_QUEUE).encode())
    os.rename(old, new)
    with open(os.path.join(new, b".queue_name"), "wb") as fh:
        fh.write(b"VHOST: /\nQUEUE: " + HOSTILE_QUEUE + b"\nINDEX: v2\n")
    staging = os.path.join(vhosts, vhost_dir_name("staging/ü".encode()).encode())
    moved = os.path.join(vhosts, vhost_dir_name(HOSTILE_VHOST).encode())
    os.rename(staging, moved)
    with open(os.path.join(moved, b".vhost"), "wb") as fh:
        fh.write(HOSTILE_VHOST)
    return base


def test_hostile_names_are_shown_as_text(tmp_path):
    base = hostile_copy(tmp_path)
    page = write_report([base], tmp_path / "hostile.html")
    html = page.read_text(encoding="utf-8")
    low = html.lower()
    for needle in ("<script", "<img", "<b on", "\u202e"):
        assert needle not in low, needle
    dom = shown(page, tmp_path)
    assert not dom.all("script") and not dom.all("img")
    assert not [e for e in dom.iter() if any(a.startswith("on") for a in e.attrs)]
    node = dom.one("section", "node")
    assert node.one(cls="node-name").text() == "rabbit@<img src=x onerror=alert(1)>\\xff"
    # names as the tables give them (undecodable bytes as the library shows them), with the bidi
    # override shown as an escape rather than obeyed
    table = cqforensics.read_table(base, "queues", columns=["vhost", "queue"]).to_pylist()
    queue = next(q["queue"] for q in table if "<script>" in q["queue"])
    vhost = next(q["vhost"] for q in table if "<b " in q["vhost"])
    assert queue.startswith("<script>alert('q')</script>") and queue.endswith("\"'&\u202e")
    assert [cell(r, "qname") for r in node.all("tr", "queue-row")].count(queue.replace("\u202e", "\\u202e")) == 1
    assert vhost in [v.one(cls="vhost-name").text() for v in node.all("section", "vhost")]
    assert vhost.startswith("<b onmouseover=alert(2)>staging")


def test_text_escapes_every_string():
    assert report.text("<a href='x'>&\"") == "&lt;a href=&#x27;x&#x27;&gt;&amp;&quot;"
    assert report.text("q\udcff") == "q\\xff"  # a name os.fsdecode made of a non-UTF-8 byte
    assert report.text("a\u202eb\x00c\u200bd") == "a\\u202eb\\x00c\\u200bd"
    assert report.text(b"\x01\xff") == "01ff"
    assert report.text(None) == "" and report.text(7) == "7"
    assert len(report.text("x" * 5000)) < 1100


# -- output rules (no browser needed) ------------------------------------------------------------------


def test_the_output_follows_the_rules_of_every_output(tmp_path, capsys):
    base = tmp_path / "in" / "mnesia"
    shutil.copytree(SAMPLE / "mnesia", base, symlinks=True)
    inside = base / "rabbit@localhost" / "report.html"
    assert main(["report", str(base), "--html", str(inside)]) == 16
    assert main(["report", str(base), "--html", str(inside), "--force"]) == 16
    assert not inside.exists()
    out = tmp_path / "r.html"
    out.write_text("keep")
    assert main(["report", str(base), "--html", str(out)]) == 16
    assert out.read_text() == "keep"
    assert "not overwritten without --force" in capsys.readouterr().err
    assert main(["report", str(base), "--html", str(out), "--force"]) == 16  # not written by cqforensics
    assert out.read_text() == "keep" and "not an output of cqforensics" in capsys.readouterr().err
    out.unlink()
    assert main(["report", str(base), "--html", str(out), "--as-of", AS_OF]) == 0
    assert main(["report", str(base), "--html", str(out), "--force", "--as-of", AS_OF]) == 0  # its own
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]
    assert main(["report", str(tmp_path / "missing"), "--html", str(tmp_path / "m.html")]) == 8
    assert not (tmp_path / "m.html").exists()


def test_a_store_file_of_many_ranges_is_drawn_in_slices():
    """A big store file: at most COARSE_SLICES rects, each its slice's dominant kind, same byte
    totals in the legend."""
    sf = report.StoreFile("/x/msg_store_persistent/0.rdq", "persistent", 0)
    for i in range(4000):
        report.StoreFile._add(sf.entries, i * 100, 100, "live" if i % 2 else "orphan")
    sf.size = 400_000
    svg = report._store_bar(sf)
    assert svg.count("<rect ") == report.COARSE_SLICES and "coarsened" in svg
    assert "live 200,000 B" in svg and "orphan 200,000 B" in svg
    small = report.StoreFile("/x/msg_store_persistent/1.rdq", "persistent", 1000)
    report.StoreFile._add(small.entries, 0, 400, "live")
    report.StoreFile._add(small.entries, 400, 100, "live")
    report.StoreFile._add(small.holes, 500, 500, "zeroed")
    report.StoreFile._add(small.holes, 0, 500, "garbage")  # under the entries: only where none is
    svg = report._store_bar(small)
    assert svg.count("<rect ") == 2 and 'data-kind="live" data-offset="0" data-length="500"' in svg
    assert 'data-kind="hole" data-offset="500" data-length="500"' in svg and "garbage" not in svg.split("</svg>")[0]
