"""The committed sample data: every file is listed with its sha256 in sample_data/README.md,
and every dataset carries a ground-truth manifest."""

import hashlib
import re
import tarfile

from support import SAMPLES, datasets, manifest
from support.oracle import archived


def _unpacked(rel: str) -> bool:
    """A file the tests unpacked from a committed archive (gitignored; the archive is listed)."""
    parts = rel.split("/")
    return len(parts) > 1 and archived(parts[0]) and (parts[1] == "mnesia" or parts[1] == ".mnesia.extracted")


def test_checksum_list_matches_every_committed_file():
    text = (SAMPLES / "README.md").read_text()
    listed = dict((path, digest) for digest, path in re.findall(r"^([0-9a-f]{64})  (.+)$", text, re.M))
    on_disk = {
        p.relative_to(SAMPLES).as_posix(): p
        for p in SAMPLES.rglob("*")
        if p.is_file() and p.name != "README.md" and "__pycache__" not in p.parts
    }
    on_disk = {rel: p for rel, p in on_disk.items() if not _unpacked(rel)}
    assert sorted(listed) == sorted(on_disk), "file list differs: run python sample_data/generate.py --readme"
    bad = [rel for rel, p in on_disk.items() if hashlib.sha256(p.read_bytes()).hexdigest() != listed[rel]]
    assert not bad, f"files changed since the checksum list was written: {bad}"


def test_every_version_and_stop_mode_is_present():
    names = set(datasets())
    for version in ("3.10.8", "4.0.5", "4.3.6"):
        assert {f"{version}-clean", f"{version}-kill"} <= names
    # written by brokers that cannot be installed here: proven by reading their data
    assert {"3.12.14-clean", "3.13.7-clean", "4.1.8-clean", "4.2.2-clean"} <= names


def test_unpacked_archives_are_exactly_their_archive():
    """An archived dataset's ``mnesia/`` holds every file of its archive, byte for byte, and
    nothing else; its manifest names the archive and its digest."""
    for ds in datasets():
        if not archived(ds):
            continue
        m = manifest(ds)
        tarball = SAMPLES / ds / m["archive"]
        assert hashlib.sha256(tarball.read_bytes()).hexdigest() == m["archive_sha256"]
        with tarfile.open(tarball) as tf:
            members = {i.name: hashlib.sha256(tf.extractfile(i).read()).hexdigest() for i in tf if i.isfile()}
        base = SAMPLES / ds / "mnesia"
        unpacked = {
            p.relative_to(base).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in base.rglob("*")
            if p.is_file()
        }
        assert unpacked == members, ds


def test_manifests_record_provenance_and_deliveries(dataset):
    m = manifest(dataset)
    assert m["broker"]["rabbitmq"] == dataset.split("-")[0]
    assert m["broker"]["otp"] and m["broker"]["package"]
    assert m["stop"] in ("clean", "kill")
    assert (SAMPLES / dataset / m["node_dir"] / "msg_stores" / "vhosts").is_dir()
    delivered = [msg for q in m["queues"] for msg in q["messages"]]
    assert delivered, "the broker delivered nothing"
    for msg in delivered:
        assert msg["protocol"] in ("amqp091", "amqp10")
        if msg["protocol"] == "amqp091":
            # imported truth recorded a named subset of the 13 basic properties (the oracle compares exactly those)
            props = m.get("properties_recorded") or 13 * [None]
            assert re.fullmatch(r"[0-9a-f]{64}", msg["body_sha256"]) and len(msg["properties"]) == len(props)
            assert m.get("properties_recorded") is None or set(msg["properties"]) == set(props)


def test_the_scenario_covers_what_the_foundation_asks_for():
    """v1 and v2 queues, both sides of the embedding threshold, fan-out, priorities, TTLs,
    dead-lettering, transient messages, AMQP 1.0 and a rolled store with compaction holes."""
    m310 = manifest("3.10.8-clean")
    versions = {q["index_version"] for q in m310["queues"] if "index_version" in q}
    assert versions == {1, 2}
    sizes = [msg["body_len"] for q in m310["queues"] for msg in q["messages"]]
    assert min(sizes) < 4096 < max(sizes)
    names = {q["name"] for q in m310["queues"]}
    assert {"audit.a", "audit.b", "audit.c", "jobs.prio", "dead", "ttl.mixed", "transient.mix"} <= names
    dead = next(q for q in m310["queues"] if q["name"] == "dead")
    assert all("x-death" in msg["headers"] for msg in dead["messages"])
    assert {q["vhost"] for q in m310["queues"]} == {"/", "staging/ü"}
    m43 = manifest("4.3.6-clean")
    assert any(msg["protocol"] == "amqp10" for q in m43["queues"] for msg in q["messages"])
    rolled = SAMPLES / "4.3.6-rolled" / "mnesia" / "rabbit@localhost" / "msg_stores" / "vhosts"
    rdq = [p for p in rolled.rglob("msg_store_persistent/*.rdq") if p.stat().st_size]
    assert len(rdq) >= 4
    assert any(b"\0" * 512 in p.read_bytes() for p in rdq), "no compaction hole in the rolled store"
