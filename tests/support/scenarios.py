"""Damage scenarios for the next-boot prediction tests: each damages a copy of a sample node dir
the way disks and crashes do, and returns where it struck.

Used by tests/real_brokers/test_predict_brokers.py, which boots the real broker on every damaged copy and
checks that fsck predicted exactly what it then delivered (or that it would crash)."""

from __future__ import annotations

import struct
from pathlib import Path

import cqforensics
from support import damage

QI = "msg_stores/vhosts/*/queues/*/*.qi"
RDQ = "msg_stores/vhosts/*/msg_store_persistent/*.rdq"


def _queue_dir(node: Path, name: bytes, vhost: bytes = b"/") -> Path:
    for qn in node.glob("msg_stores/vhosts/*/queues/*/.queue_name"):
        raw = qn.read_bytes()
        if raw.startswith(b"VHOST: " + vhost + b"\nQUEUE: " + name + b"\n"):
            return qn.parent
    raise LookupError(name)


def _store_entries(node: Path):
    rows = cqforensics.read_table(
        node, "store", columns=["vhost", "file", "offset", "total_size", "status"]
    ).to_pylist()
    return [r for r in rows if r["vhost"] == "/" and r["status"] == "live"]


def _biggest_rdq(node: Path) -> Path:
    return max(node.glob(RDQ), key=lambda p: p.stat().st_size if "628WB" in str(p) else 0)


def rdq_zeroed_range(node: Path) -> str:
    """Zero one live entry in the middle of the biggest store file (<= 3.13.0 loses what follows)."""
    rdq = _biggest_rdq(node)
    entries = [e for e in _store_entries(node) if e["file"] == str(rdq)]
    e = entries[len(entries) // 3]
    return damage.zero(rdq, e["offset"], e["total_size"])


def rdq_truncated(node: Path) -> str:
    """Cut the biggest store file in the middle of a live entry."""
    rdq = _biggest_rdq(node)
    entries = [e for e in _store_entries(node) if e["file"] == str(rdq)]
    e = entries[len(entries) // 2]
    return damage.truncate(rdq, e["offset"] + e["total_size"] // 2)


def rdq_missing(node: Path) -> str:
    """Delete the biggest store file."""
    return damage.remove(_biggest_rdq(node))


def rdq_marker_flip(node: Path) -> str:
    """Break the 255 write marker of one live entry."""
    rdq = _biggest_rdq(node)
    e = [e for e in _store_entries(node) if e["file"] == str(rdq)][1]
    return damage.flip(rdq, e["offset"] + e["total_size"] - 1)


def _qi_slot(node: Path, queue: bytes, loc: int | None = None, nth: int = 0) -> tuple[Path, int]:
    qi = _queue_dir(node, queue) / "0.qi"
    data = qi.read_bytes()
    hits = [o for o in range(64, len(data) - 31, 32) if data[o] == 1 and (loc is None or data[o + 3] == loc)]
    return qi, hits[nth]


def qs_crc(node: Path) -> str:
    """Flip a byte inside a .qs message term (its CRC no longer matches)."""
    qi, off = _qi_slot(node, b"orders.v2", loc=2, nth=1)
    data = qi.read_bytes()
    qs_off, qs_size = struct.unpack_from(">QI", data, off + 4)
    return damage.flip(qi.with_suffix(".qs"), qs_off + 8 + qs_size // 2)


def qs_missing(node: Path) -> str:
    """Delete a queue's .qs segment (its small messages)."""
    return damage.remove(_queue_dir(node, b"orders.v2") / "0.qs")


def qi_bad_header(node: Path) -> str:
    """Zero a .qi segment's magic: the broker deletes the segment."""
    return damage.zero(_queue_dir(node, b"audit.b") / "0.qi", 0, 8)


def qi_bad_header_and_slot(node: Path) -> str:
    """Zero a .qi segment's magic and set a reserved flag bit in one of its live slots: a dirty
    start deletes the segment without parsing a slot (no queue crash); a clean one trusts it."""
    qi, off = _qi_slot(node, b"audit.b")
    damage.flip(qi, off + 1, 0x04)
    return damage.zero(qi, 0, 8)


def qi_reserved_bit(node: Path) -> str:
    """Set a reserved flag bit in a live .qi slot (the broker's strict parser has no clause for it)."""
    qi, off = _qi_slot(node, b"work")
    return damage.flip(qi, off + 1, 0x04)


def queue_name_lost(node: Path) -> str:
    """Delete a queue's .queue_name (informational: the broker never reads it)."""
    return damage.remove(_queue_dir(node, b"dead") / ".queue_name")


def v1_segment_truncated(node: Path) -> str:
    """Cut a CQv1 segment in the middle of a publish record (3.10 only)."""
    idx = max(_queue_dir(node, b"orders.v1").glob("*.idx"), key=lambda p: p.stat().st_size)
    return damage.truncate(idx, 20)


def v1_journal_torn(node: Path) -> str:
    """Cut the CQv1 journal in the middle of its last record (3.10 only)."""
    jif = max(node.glob("msg_stores/vhosts/*/queues/*/journal.jif"), key=lambda p: p.stat().st_size)
    return damage.truncate(jif, jif.stat().st_size - 10)


SCENARIOS = {
    "rdq_zeroed_range": rdq_zeroed_range,
    "rdq_truncated": rdq_truncated,
    "rdq_missing": rdq_missing,
    "rdq_marker_flip": rdq_marker_flip,
    "qs_crc": qs_crc,
    "qs_missing": qs_missing,
    "qi_bad_header": qi_bad_header,
    "qi_bad_header_and_slot": qi_bad_header_and_slot,
    "qi_reserved_bit": qi_reserved_bit,
    "queue_name_lost": queue_name_lost,
    "v1_segment_truncated": v1_segment_truncated,
    "v1_journal_torn": v1_journal_torn,
}
V1_ONLY = {"v1_segment_truncated", "v1_journal_torn"}


# -- several scenarios on one copy: one boot for damages that cannot reach each other -----------------
# A broker boot costs 4-6 CPU-seconds. Scenarios whose damage stays inside the dir of one queue,
# each a different queue, can be applied together to one copy that the broker boots once; each
# queue is then compared with what the scenario that damaged it expects. A damage of a vhost's
# shared message store reaches every queue with messages in it: those scenarios boot alone.
# Used by tests/real_brokers/test_predict_brokers.py and test_writers_brokers.py (rebuild).

#: the scenarios that change files of one queue's own dir only, and the queue (the same in every
#: sample those scenarios run on)
CONFINED_TO = {
    "qs_crc": "orders.v2",
    "qs_missing": "orders.v2",
    "qi_bad_header": "audit.b",
    "qi_bad_header_and_slot": "audit.b",
    "qi_reserved_bit": "work",
    "queue_name_lost": "dead",
    "v1_segment_truncated": "orders.v1",
    "v1_journal_torn": "transient.mix.v1",  # the biggest journal.jif of the 3.10.8 samples
}


def shared_boots(cases, alone=()) -> list[tuple[str, tuple[str, ...]]]:
    """(dataset, scenario) cases as boots: per dataset, each scenario of ``CONFINED_TO`` (and
    not in ``alone``) joins the first boot of such scenarios that all damage other queues;
    every other scenario boots alone."""
    boots: list[tuple[str, list[str]]] = []

    def confined(sc):
        return None if sc in alone else CONFINED_TO.get(sc)

    for ds, sc in cases:
        q = confined(sc)
        shared = next(
            (g for d, g in boots if d == ds and q and all(confined(o) not in (None, q) for o in g)),
            None,
        )
        if shared is None:
            boots.append((ds, [sc]))
        else:
            shared.append(sc)
    return [(ds, tuple(g)) for ds, g in boots]


def boot_ids(boots) -> list[str]:
    return [f"{d}-{'+'.join(g)}" for d, g in boots]


def changed_files(sample_node: Path, node: Path) -> dict[str, bytes | None]:
    """The files of ``node`` (a damaged copy of ``sample_node``) that differ from the sample's,
    relative to the node dir: their bytes now, or None for a file removed."""
    import filecmp
    import os

    out: dict[str, bytes | None] = {}
    for root in (sample_node, node):
        for dirpath, _, files in os.walk(root):
            for name in files:
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                if rel in out:
                    continue
                if not (node / rel).exists():
                    out[rel] = None
                elif not (sample_node / rel).exists() or not filecmp.cmp(sample_node / rel, node / rel, shallow=False):
                    out[rel] = (node / rel).read_bytes()
    return out


def apply_changes(changes: dict[str, bytes | None], node: Path) -> None:
    """Make ``node`` (a copy of the sample) hold ``changes`` (of ``changed_files``)."""
    for rel, data in changes.items():
        if data is None:
            (node / rel).unlink()
        else:
            (node / rel).write_bytes(data)


def owners(sample_node: Path, changes: dict[str, dict]) -> dict[tuple[str, str], str]:
    """(vhost, queue) -> the scenario that changed files of its dir, for scenarios to share a
    boot (``changes``: per scenario, its ``changed_files``). Fails unless each scenario changed
    files of its ``CONFINED_TO`` queue's dir only, and no two the same queue's."""
    import os

    import cqforensics

    dirs = {
        os.path.relpath(r["queue_dir"], sample_node): (r["vhost"], r["queue"])
        for r in cqforensics.read_table(
            sample_node.parent, "queues", columns=["vhost", "queue", "queue_dir"]
        ).to_pylist()
    }
    out: dict[tuple[str, str], str] = {}
    for sc, changed in changes.items():
        assert changed, f"{sc}: damaged nothing"
        for rel in changed:
            key = next((k for d, k in dirs.items() if rel.startswith(d + os.sep)), None)
            assert key is not None, f"{sc}: changed {rel}, outside any queue dir: it cannot share a boot"
            assert key[1] == CONFINED_TO.get(sc), f"{sc}: changed {rel}, of {key}, not of {CONFINED_TO.get(sc)!r}"
            assert out.setdefault(key, sc) == sc, f"{sc} and {out[key]} both damage {key}: they cannot share a boot"
    return out


# -- quorum queues (Ra files under quorum/<node>/) ---------------------------------------------------
# Used by tests/real_brokers/test_quorum_brokers.py (the real broker boots on each damaged copy) and
# tests/model/test_quorum_damage.py (readers and findings, no broker).


def _ra(node: Path) -> Path:
    return node / "quorum" / node.name


def _wal(node: Path) -> Path:
    return max(_ra(node).glob("*.wal"), key=lambda p: int(p.stem))


def _wal_records(node: Path, queue: bytes = b"qq.orders"):
    """(scan, rows of ``queue``'s server) of the newest WAL."""
    from cqforensics.readers import ra_wal

    uid = _server(node, queue).name.encode()
    scan = ra_wal.walk(_wal(node))
    return scan, [i for i in range(len(scan)) if scan.uid(i) == uid]


def _server(node: Path, queue: bytes) -> Path:
    from cqforensics.readers.ra_system import read_config

    for cfg in sorted(_ra(node).glob("*/config")):
        if read_config(cfg).queue_resource == (b"/", queue):
            return cfg.parent
    raise LookupError(queue)


def wal_torn(node: Path) -> str:
    """Cut the WAL at 60% of its length (a crash mid-write, or a lost tail): the records past the
    cut are lost, acks and settles among them too."""
    wal = _wal(node)
    return damage.truncate(wal, wal.stat().st_size * 6 // 10)


def wal_zeroed_tail(node: Path) -> str:
    """Zero the WAL's last 40% (a preallocated or unwritten tail): recovery stops at the zeros."""
    wal = _wal(node)
    size = wal.stat().st_size
    return damage.zero(wal, size * 6 // 10, size - size * 6 // 10)


def wal_bad_checksum(node: Path) -> str:
    """Flip a byte in the data of a record in the middle of the WAL (not the last record):
    ``wal_checksum_validation_failure``."""
    scan, rows = _wal_records(node)
    i = rows[len(rows) // 2]
    return damage.flip(_wal(node), int(scan.data_offset[i]) + int(scan.length[i]) // 2)


def wal_bad_last_record(node: Path) -> str:
    """Flip a byte in the data of the WAL's last record: Ra drops that record and goes on."""
    from cqforensics.readers import ra_wal

    wal = _wal(node)
    scan = ra_wal.walk(wal)
    i = len(scan) - 1
    return damage.flip(wal, int(scan.data_offset[i]) + int(scan.length[i]) // 2)


def _segments(node: Path, queue: bytes = b"qq.orders") -> list[Path]:
    return sorted(_server(node, queue).glob("*.segment"), key=lambda p: int(p.stem))


def segment_bad_crc(node: Path) -> str:
    """Flip a byte in an entry in the middle of a quorum queue's second segment."""
    from cqforensics.readers import ra_segment

    seg = _segments(node)[1]
    s = ra_segment.read_segment(seg)
    i = len(s) // 2
    return damage.flip(seg, int(s.offset[i]) + int(s.length[i]) // 2)


def segment_truncated(node: Path) -> str:
    """Cut a quorum queue's last segment in the middle of its data."""
    seg = _segments(node)[-1]
    return damage.truncate(seg, seg.stat().st_size // 2)


def segment_missing(node: Path) -> str:
    """Delete a quorum queue's second segment (a gap in its log)."""
    return damage.remove(_segments(node)[1])


def snapshot_damaged(node: Path) -> str:
    """Flip a byte in a quorum queue's snapshot (past its header: the checksum fails)."""
    snap = next(_server(node, b"qq.orders").glob("snapshots/*/snapshot.dat"))
    return damage.flip(snap, snap.stat().st_size - 20)


def meta_missing(node: Path) -> str:
    """Delete meta.dets (every server's term, vote and last applied index)."""
    return damage.remove(_ra(node) / "meta.dets")


def names_missing(node: Path) -> str:
    """Delete names.dets (the registry of the node's Ra servers)."""
    return damage.remove(_ra(node) / "names.dets")


QUORUM_SCENARIOS = {
    "wal_torn": wal_torn,
    "wal_zeroed_tail": wal_zeroed_tail,
    "wal_bad_checksum": wal_bad_checksum,
    "wal_bad_last_record": wal_bad_last_record,
    "segment_bad_crc": segment_bad_crc,
    "segment_truncated": segment_truncated,
    "segment_missing": segment_missing,
    "snapshot_damaged": snapshot_damaged,
    "meta_missing": meta_missing,
    "names_missing": names_missing,
}
#: scenarios that need a sample whose quorum queue has segments (4.0.5) or a snapshot (3.10.8, 4.3.6)
SEGMENT_SCENARIOS = {"segment_bad_crc", "segment_truncated", "segment_missing"}
SNAPSHOT_SCENARIOS = {"snapshot_damaged"}
