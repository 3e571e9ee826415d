"""The committed sample data: every file is listed with its sha256 in sample_data/README.md,
and every dataset carries a ground-truth manifest."""

import hashlib
import re

from conftest import SAMPLES, datasets, manifest


def test_checksum_list_matches_every_committed_file():
    text = (SAMPLES / "README.md").read_text()
    listed = dict((path, digest) for digest, path in re.findall(r"^([0-9a-f]{64})  (.+)$", text, re.M))
    on_disk = {p.relative_to(SAMPLES).as_posix(): p for p in SAMPLES.rglob("*") if p.is_file()
               and p.name != "README.md" and "__pycache__" not in p.parts}
    assert sorted(listed) == sorted(on_disk), "file list differs: run python sample_data/generate.py --readme"
    bad = [rel for rel, p in on_disk.items() if hashlib.sha256(p.read_bytes()).hexdigest() != listed[rel]]
    assert not bad, f"files changed since the checksum list was written: {bad}"


def test_every_version_and_stop_mode_is_present():
    names = set(datasets())
    for version in ("3.10.8", "4.0.5", "4.3.6"):
        assert {f"{version}-clean", f"{version}-kill"} <= names


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
            assert re.fullmatch(r"[0-9a-f]{64}", msg["body_sha256"]) and len(msg["properties"]) == 13


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
