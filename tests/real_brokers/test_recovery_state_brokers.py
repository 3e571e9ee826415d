"""The clean recovery path when its recorded state is wrong, against real brokers (issue 14).

After a clean stop the broker trusts ``clean.dot``, ``msg_store_index.ets``, ``file_summary.ets``
and ``recovery.dets`` instead of scanning. Each case below is made at test time from a copy of a
clean sample that the real broker of its version booted and stopped cleanly itself:

* ``stale``: the recovery files of that clean stop are put back on top of later data (the broker
  booted again, was published to and consumed from, then killed with kill -9);
* ``ets_flipped`` / ``ets_truncated``: ``msg_store_index.ets`` damaged;
* ``rdq_missing`` / ``qs_missing``: a store file the recorded state refers to deleted.

fsck predicts, per queue, what the next boot delivers, and whether the queue crashes (a read the
recorded state misplaces: the consumer gets 541 INTERNAL_ERROR) or hangs; the broker then boots
and every queue is drained with time limits, recording what it did.

The message store crashing under the running vhost (docs/store-crash.md) is tried on a store of
many files (64 KiB each) that a broker of each version writes at test time (``STORE_CASES``):
a middle ``.rdq`` missing (the reading queue crashes at each read from there), and
``msg_store_index.ets`` cut past its middle, inside the record of an expired message (every queue
crashes once on what it no longer records, and the one dropping that expired message crashes the
store: the vhost restarts). There fsck gives bounds, and what each queue delivers must lie
within them. Each version's broker boots and stops once for all the cases of a kind
(``stopped``); ``ets:file2tab`` itself is checked against the OTP of each broker."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

import pytest

from support import SAMPLES, need_broker
from support.live import consume, drain_queues, publish, wait_log_quiet
from support.nodes import ets_items, queue_dir, root_vhost, vhost_dirs

RECOVERY_FILES = ("clean.dot", "msg_store_index.ets", "file_summary.ets")


# -- making the cases --------------------------------------------------------------------------------


def save_recovery_files(node: Path) -> dict[Path, bytes]:
    """The clean-shutdown files of every vhost (relative path -> bytes)."""
    out = {}
    for v in vhost_dirs(node):
        for p in [v / "recovery.dets", *(v / "msg_store_persistent" / n for n in RECOVERY_FILES)]:
            if p.exists():
                out[p.relative_to(node)] = p.read_bytes()
    return out


def put_back(node: Path, saved: dict[Path, bytes]) -> None:
    for rel, data in saved.items():
        p = node / rel
        p.write_bytes(data)
        try:
            shutil.chown(p, *_owner(node))
        except (LookupError, PermissionError, TypeError):
            pass


def _owner(node: Path):
    st = node.stat()
    return st.st_uid, st.st_gid


# -- draining with time limits -----------------------------------------------------------------------


def observe(
    b, queues: dict[str, list[str]], settle: float = 5.0, timeout: float = 15.0, restart: frozenset = frozenset()
) -> dict:
    """Per (vhost, queue) of ``queues`` (vhost -> names: those fsck reports), what draining got
    (``drain_queues``: each queue's retries after a crash wait while the others are drained).
    A queue the broker does not have (every basic.get refused with 404 NOT_FOUND, nothing
    delivered, no attempt ending on an empty queue) has no ``delivered``: not served. (The queues
    come from fsck rather than from ``rabbitmqctl list_queues``, an Erlang VM booted per vhost per
    case: a queue the broker holds and fsck does not report was never compared either.)
    ``restart``: vhosts whose crash is predicted. Once such a vhost's message store has crashed,
    the broker restarts the vhost, or sometimes leaves it down (seen once on 3.10.8,
    rdq_missing: a queue's read got 541, the next one hung, every other queue 404 for a minute;
    probably restarts too fast for the vhost's supervisor). A queue left undrained there (no
    attempt ended empty) is drained again after ``rabbitmqctl restart_vhost``, as an operator
    would: what it then delivers is the prediction's ``predicted_after_restart``. Draining starts
    once the broker's log has been quiet (``wait_log_quiet``), ``settle`` seconds at most after
    the boot or the restart (a fixed 5 s before: 3 to 4 s more a boot on a quiet broker)."""
    wait_log_quiet(b, settle)
    out = {}
    for vhost, names in sorted(queues.items()):
        for name, rec in drain_queues(b, vhost, sorted(names), timeout).items():
            out[(vhost, name)] = rec
        left = [k for k, v in out.items() if k[0] == vhost and v["events"][-1][1] != "empty"]
        if vhost in restart and left:
            b.ctl("restart_vhost", "--vhost", vhost, check=False)  # refused when it is running
            wait_log_quiet(b, settle)
            for key, again in zip(left, drain_queues(b, vhost, [k[1] for k in left], timeout).values()):
                rec = out[key]
                rec["delivered"] += again["delivered"]
                rec["bodies"] += again["bodies"]
                rec["errors"] += again["errors"]
                rec["events"] += [(0, "restart_vhost")] + again["events"]
                rec["hang"] = again["hang"]  # a read left waiting by the crash is not a hang of the queue
    for key, rec in out.items():  # (404 for every queue of a vhost left down, then served: not absent)
        if not rec["delivered"] and set(rec["errors"]) == {404} and all(e != "empty" for _, e in rec["events"]):
            out[key] = {"absent": rec["events"]}
    return out


def fsck_queues(report) -> dict[str, list[str]]:
    """vhost -> the queues fsck reports in it."""
    out: dict[str, list[str]] = {}
    for q in report.queues:
        out.setdefault(q.vhost, []).append(q.queue)
    return out


#: the store of many files the store-crash cases start from (per version, written at test time)
STORE_CONFIG = "[{rabbit, [{msg_store_file_size_limit, 65536}]}]."
BULK = {"bulk.v1": (1, 120), "bulk.v2": (2, 60)}  # queue: (x-queue-version, messages of 5,000 bytes)
#: 20 messages of 5,000 bytes the next boot finds expired (no DLX). The TTL must outlast the publish
#: and the clean stop: at 15 s, a stop on a machine at load 5 came after it (0 of 20 left on disk)
TTL_QUEUE, TTL_MS = "ttl.big", 25000


def declare(b, name: str, arguments: dict) -> None:
    from brokers.clients import pika_module

    pika = pika_module()
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    conn.channel().queue_declare(name, durable=True, arguments=arguments)
    conn.close()


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """``stopped(version, kind)``: the mnesia base of the version's clean sample once its own broker
    has booted it and stopped it cleanly (``kind`` "clean"), or has first written a store of many
    files to it (``kind`` "store": ``BULK`` queues and ``TTL_QUEUE``, under ``STORE_CONFIG``).
    Each is made once per test session (one boot) and copied by each case that starts from it
    (``support.session.made_once``: in the session's temp dir, which the xdist workers share,
    made under a file lock by the first worker that needs it)."""
    import tempfile

    from brokers import Broker
    from support.session import made_once

    def make(version: str, kind: str) -> Path:
        need_broker(version)

        def write(part: Path) -> None:
            base = Path(tempfile.mkdtemp(prefix="cqf-broker-"))
            base.chmod(0o755)
            try:
                _make_stopped(
                    Broker(version, base / "run", advanced_config=STORE_CONFIG if kind == "store" else None), kind
                )
                shutil.copytree(base / "run" / "mnesia", part, symlinks=True)
            finally:
                shutil.rmtree(base, ignore_errors=True)

        return made_once(tmp_path_factory, f"stopped-{version}-{kind}", write)

    return make


def _make_stopped(b, kind: str) -> None:
    """Boot the version's clean sample in ``b``, write the store of ``kind`` "store", stop cleanly."""
    version = b.version
    with b:
        b.install_node(SAMPLES / f"{version}-clean" / "mnesia")
        b.start()
        if kind == "store":
            from cqforensics.model.versions import model

            for name, (v, n) in BULK.items():  # 4.3 refuses v1 (4.0-4.2 take it and convert it)
                declare(b, name, {"x-queue-version": v} if model(version).reads_v1 else {})
                publish(b, name, n, 5000, name)
            declare(b, TTL_QUEUE, {"x-message-ttl": TTL_MS})
            publish(b, TTL_QUEUE, 20, 5000, TTL_QUEUE)
            published = time.monotonic()
        b.stop()  # the broker's own clean stop: its recovery files describe its data
        if kind == "store":  # the next boot finds them expired, and so does fsck before it
            time.sleep(max(0.0, TTL_MS / 1000 + 1 - (time.monotonic() - published)))
            on_disk = len(ids_of(b.node_dir, version, TTL_QUEUE))
            assert on_disk == 20, f"{on_disk} of the 20 {TTL_QUEUE} messages outlived the clean stop (slow stop?)"


def make_case(b, case: str) -> str:
    """Turn the node dir of ``b`` (stopped cleanly by its own broker just before) into ``case``;
    returns what was done."""
    node = b.node_dir
    store = root_vhost(node) / "msg_store_persistent"
    if case == "stale":  # the clean stop's files, put back on top of later work and a kill -9
        saved = save_recovery_files(node)
        b.start()
        publish(b, "work", 10, 6000, "big")  # shared store
        publish(b, "work", 10, 100, "small")  # queue store
        done = f"consumed audit.a {consume(b, 'audit.a', 3)}, orders.v2 {consume(b, 'orders.v2', 2)}"
        time.sleep(1)
        b.kill()
        put_back(node, saved)
        return f"stale recovery files; published 20 to work, {done}"
    ets = store / "msg_store_index.ets"
    if case == "ets_flipped":
        data = bytearray(ets.read_bytes())
        mid = len(data) // 2
        for i in range(mid, mid + 8):
            data[i] ^= 0xFF
        ets.write_bytes(bytes(data))
        return f"flipped 8 bytes of msg_store_index.ets at {mid}"
    if case == "ets_truncated":  # torn inside the item 4 objects before the end
        data = ets.read_bytes()
        items, o = [], 8
        while o + 8 <= len(data):
            items.append(o)
            size = int.from_bytes(data[o : o + 4], "big")
            o += 8 + (16 if size >= 65528 else 0) + size
        cut = items[-5] + 10  # items[-1] is the end marker
        ets.write_bytes(data[:cut])
        return f"msg_store_index.ets truncated to {cut} of {len(data)} bytes (inside its 4th last object)"
    if case == "rdq_missing":
        rdq = max(store.glob("*.rdq"), key=lambda p: p.stat().st_size)
        rdq.unlink()
        return f"removed {rdq.name}"
    if case == "qs_missing":
        (queue_dir(node, b"orders.v2") / "0.qs").unlink()
        return "removed orders.v2's 0.qs"
    if case == "rdq_missing_middle":  # a file in the middle of bulk.v1's messages
        files = sorted({int(Path(f).stem) for f in store_files_of(node, b.version, "bulk.v1")})
        rdq = store / f"{files[len(files) // 2]}.rdq"
        rdq.unlink()
        return f"removed {rdq.name} of {len(list(store.glob('*.rdq'))) + 1} store files"
    if case == "ets_cut_ttl":  # cut inside the first item of a TTL_QUEUE message past the middle
        ids, data = ids_of(node, b.version, TTL_QUEUE), ets.read_bytes()
        at = [o for o, obj in ets_items(ets) if isinstance(obj, tuple) and len(obj) > 1 and obj[1] in ids]
        cut = next((o for o in at if o >= len(data) // 2), at[-1]) + 10
        ets.write_bytes(data[:cut])
        return f"msg_store_index.ets cut to {cut} of {len(data)} bytes (inside an item of a {TTL_QUEUE} message)"
    raise ValueError(case)


def _rows(node: Path, version: str, queue: str) -> list[dict]:
    import cqforensics

    rows = cqforensics.read_table(
        node, table="messages", broker_version=version, columns=["vhost", "queue", "msg_id", "location", "store_file"]
    ).to_pylist()
    return [r for r in rows if r["vhost"] == "/" and r["queue"] == queue and r["location"] == "shared_store"]


def ids_of(node: Path, version: str, queue: str) -> set[bytes]:
    return {r["msg_id"] for r in _rows(node, version, queue)}


def store_files_of(node: Path, version: str, queue: str) -> list[str]:
    return [r["store_file"] for r in _rows(node, version, queue)]


def predicted_bodies(node: Path, version: str) -> tuple[dict, set[str], set[str]]:
    """Per (vhost, queue): sha256 of the bodies fsck predicts the next boot delivers; the
    bodies of messages the recorded store index lacks; the bodies of shared-store messages
    more than one queue holds."""
    import cqforensics

    t = cqforensics.read_table(
        node,
        table="messages",
        broker_version=version,
        columns=["vhost", "queue", "body", "msg_id", "location", "survives_restart", "drop_reason"],
    ).to_pylist()
    out: dict[tuple[str, str], set[str]] = {}
    unrecorded, holders = set(), {}
    for r in t:
        s = out.setdefault((r["vhost"], r["queue"]), set())
        if r["body"] is None:
            continue
        digest = hashlib.sha256(r["body"]).hexdigest()
        if r["survives_restart"]:
            s.add(digest)
        if r["drop_reason"] == "not_in_store_index":
            unrecorded.add(digest)
        if r["location"] == "shared_store":
            holders.setdefault(digest, set()).add((r["vhost"], r["queue"]))
    return out, unrecorded, {d for d, qs in holders.items() if len(qs) > 1}


VERSIONS = ("3.10.8", "4.0.5", "4.3.6")
CASES = ("stale", "ets_flipped", "ets_truncated", "rdq_missing", "qs_missing")


@pytest.mark.broker
@pytest.mark.parametrize(
    "version, case", [(v, c) for v in VERSIONS for c in CASES], ids=[f"{v}-{c}" for v in VERSIONS for c in CASES]
)
def test_clean_start_on_wrong_state_matches_the_real_broker(version, case, broker_dir, stopped):
    """Per queue: what the broker delivered (distinct bodies: a queue that crashes loses the
    acks of what it delivered just before, and delivers those again after its restart) equals
    what fsck predicts; a queue predicted to crash on a read got an error (541), one predicted
    to restart may have, every other queue none; and fsck reports an error finding whenever the
    recorded state is wrong."""
    from brokers import Broker
    from cqforensics.commands import fsck

    need_broker(version)
    with Broker(version, broker_dir / "run") as b:
        b.install_node(stopped(version, "clean"))  # booted and stopped cleanly by this broker
        what = make_case(b, case)
        report = fsck.run(b.node_dir, broker_version=version)
        bodies, unrecorded, shared = predicted_bodies(b.node_dir, version)
        b.start()
        got = observe(b, fsck_queues(report), restart=frozenset(q.vhost for q in report.queues if q.crash == "vhost"))
        b.kill()  # a clean stop after crashed queues can hang (seen on 3.10.8 and 4.0.5)
    problems = compare(report, (bodies, unrecorded, shared), got)
    assert not problems, f"{what}:\n" + "\n".join(problems)


def compare(report, predicted, got: dict) -> list[str]:
    """What differs between fsck's per-queue prediction and what the broker did (``observe``)."""
    bodies, unrecorded, shared = predicted
    out = []
    lossy = any(set(q.drops) & {"not_in_store_index", "not_in_recovery_terms"} or q.crash for q in report.queues)
    if report.exit_code != 4 and (lossy or not any(f.severity != "info" for f in report.findings)):
        out.append("fsck found no error (or, nothing being lost, no warning)")
    restarts = {f.queue for f in report.findings if f.code == "recovery-terms-mismatch" and f.details.get("restarts")}
    restarts |= {q for f in report.findings if f.code == "store-index-mismatch" for q in f.details.get("queues", [])}
    vhost_crash = {q.vhost for q in report.queues if q.crash == "vhost"}
    for q in report.queues:
        key = (q.vhost, q.queue)
        g = got.get(key)
        if g is None or "delivered" not in g:
            out.append(f"{key} not served: {g}")
            continue
        if q.crash == "queue":
            if not g["errors"]:
                out.append(f"{key}: predicted a crash on read, the broker delivered {g['delivered']}")
            if set(q.drops) & {"delivery_crash", "queue_crash"}:
                continue  # a read the recorded state misplaces, after every restart: lost from there
            restarts.add(q.queue)  # it crashes once; the restart recovers dirty
        if g["hang"]:
            out.append(f"{key} hung")
        distinct = set(g["bodies"])
        want = bodies.get(key, set())
        restarted = q.queue in restarts
        if q.queue.startswith("amqp10"):  # delivered converted: compare counts
            ok = len(distinct) == len(want) or restarted
        elif restarted:
            # known limits of a crash and restart, both timing-dependent: the acks the crashed
            # queue loses are acked again after its restart, which can take a message another
            # restarted queue shares to a count of 0 (then gone for the later one); and once
            # (4.3.6, queue work of ets_truncated) an unrecorded message was delivered anyway
            ok = distinct - want <= unrecorded and want - distinct <= shared
        else:
            ok = distinct == want
        if not ok:
            out.append(
                f"{key}: delivered {len(distinct)} distinct, predicted {len(want)}: "
                f"{len(distinct - want)} unexpected, {len(want - distinct)} missing ({g['events']})"
            )
        if not (restarted or q.vhost in vhost_crash) and (g["errors"] or g["delivered"] != q.predicted_after_restart):
            out.append(f"{key}: predicted {q.predicted_after_restart} without a crash, the broker: {g['events']}")
    return out


def test_store_index_is_read_as_file2tab_loads_it(tmp_path):
    """ets:file2tab (no verify) skips a damaged item and ends the table at a torn item, and the
    start stays clean: the ids it loses are ``not_in_store_index`` (OTP 25's file2tab loaded 30
    of 31 and 12 of 31 objects of these very cuts of a 4.3.6 dump)."""
    from cqforensics.commands import fsck
    from cqforensics.readers.terms import file2tab_objects
    from support import copy_node

    node = copy_node("4.3.6-clean", tmp_path / "a")
    ets = root_vhost(node) / "msg_store_persistent" / "msg_store_index.ets"
    whole = len(file2tab_objects(ets))
    data = bytearray(ets.read_bytes())
    second = 8 + 8 + int.from_bytes(data[8:12], "big")  # the first object's item (after the table info)
    data[second + 4] ^= 0xFF  # its item magic
    ets.write_bytes(bytes(data))
    assert len(file2tab_objects(ets)) == whole - 1
    report = fsck.run(node, broker_version="4.3.6")
    assert {n.recovery for n in report.queues} == {"clean"}
    ets.write_bytes(bytes(data[:second]))
    assert file2tab_objects(ets) == []
    report = fsck.run(node, broker_version="4.3.6")
    lost = sum(q.drops.get("not_in_store_index", 0) for q in report.queues)
    assert lost and any(f.code == "store-index-mismatch" and f.severity == "error" for f in report.findings)


def test_recovery_terms_that_disagree_with_the_index_restart_the_queue(tmp_path):
    """A message acked after the clean stop (its .qi slot zeroed) while recovery.dets still
    counts it: the queue crashes at init and restarts from its files (seen on 3.10.8, 4.0.5
    and 4.3.6), so the prediction is the index's own messages, with a recovery-terms-mismatch."""
    from cqforensics.commands import fsck
    from support import copy_node

    node = copy_node("4.3.6-clean", tmp_path / "a")
    qi = queue_dir(node, b"audit.b") / "0.qi"
    data = bytearray(qi.read_bytes())
    live = [o for o in range(64, len(data) - 31, 32) if data[o] == 1]
    data[live[0] : live[0] + 32] = bytes(32)  # acked: IDX2 zeroes the slot
    qi.write_bytes(bytes(data))
    report = fsck.run(node, broker_version="4.3.6")
    q = next(v for v in report.queues if v.queue == "audit.b")
    assert q.messages == q.predicted_after_restart == len(live) - 1
    hit = [f for f in report.findings if f.code == "recovery-terms-mismatch" and f.queue == "audit.b"]
    assert hit and hit[0].severity == "error" and hit[0].details["restarts"]


# -- the message store crashing under the running vhost --------------------------------------------

STORE_CASES = ("rdq_missing_middle", "ets_cut_ttl")


@pytest.mark.broker
@pytest.mark.parametrize(
    "version, case",
    [(v, c) for v in VERSIONS for c in STORE_CASES],
    ids=[f"{v}-{c}" for v in VERSIONS for c in STORE_CASES],
)
def test_store_crash_stays_within_the_predicted_bounds(version, case, broker_dir, stopped):
    """On a store of many files: each queue delivers (distinct bodies once a crash made it
    deliver some again) between fsck's ``predicted_min`` and ``predicted_max``, and exactly
    ``predicted_after_restart`` where those are equal; a queue predicted to crash got errors (541).
    ``rdq_missing_middle``: the queue reading into the missing file is lost from there, and what
    precedes it is delivered (3.10-3.12 exactly). ``ets_cut_ttl``: the queue dropping expired
    messages the cut index lacks crashes the store (the broker's log says so), as the
    ``store-crash`` finding predicts, and the vhost restarts."""
    from brokers import Broker
    from cqforensics.commands import fsck

    with Broker(version, broker_dir / "run", advanced_config=STORE_CONFIG) as b:
        b.install_node(stopped(version, "store"))
        what = make_case(b, case)
        report = fsck.run(b.node_dir, broker_version=version)
        b.start()
        got = observe(b, fsck_queues(report), restart=frozenset(q.vhost for q in report.queues if q.crash == "vhost"))
        log = b.log_file.read_text(errors="replace")
        b.kill()
    problems = compare_bounds(report, got)
    crash = [f for f in report.findings if f.code == "store-crash"]
    if case == "ets_cut_ttl":
        if "rabbit_msg_store,remove_message" not in log:
            problems.append("the broker's message store did not crash on the remove")
        if not crash or TTL_QUEUE not in crash[0].details["triggers"].get("remove", []):
            problems.append(f"no store-crash finding names {TTL_QUEUE} dropping unrecorded messages: {crash}")
    if case == "rdq_missing_middle":
        bulk = next(q for q in report.queues if q.queue == "bulk.v1")
        if bulk.crash != "queue" or not 0 < bulk.predicted_max < bulk.messages:
            problems.append(f"bulk.v1: predicted {bulk.to_dict()}")
    assert not problems, f"{what}:\n" + "\n".join(problems)


def compare_bounds(report, got: dict) -> list[str]:
    """What differs between fsck's bounds and what the broker did (``observe``)."""
    out = []
    for q in report.queues:
        key = (q.vhost, q.queue)
        g = got.get(key)
        if g is None or "delivered" not in g:
            if q.predicted_min:
                out.append(f"{key} not served: {g}, predicted at least {q.predicted_min}")
            continue
        # redelivered after a crash: count each body once (else as delivered: bodies may repeat)
        n = len(set(g["bodies"])) if g["errors"] or g["hang"] else g["delivered"]
        if not q.predicted_min <= n <= q.predicted_max:
            out.append(
                f"{key}: delivered {n}, predicted {q.predicted_after_restart} "
                f"({q.predicted_min}..{q.predicted_max}) ({g['events']})"
            )
        if q.crash == "queue" and not (g["errors"] or g["hang"]):
            out.append(f"{key}: predicted a crash, the broker delivered {g['delivered']} ({g['events']})")
    return out


@pytest.mark.broker
@pytest.mark.parametrize("version", VERSIONS)
def test_store_index_is_loaded_as_otp_file2tab_loads_it(version, tmp_path):
    """``readers.terms.file2tab_load`` against the OTP each broker runs on (25, 27, 29): the
    same objects (count and keys), the same error, or the same exception, on damaged copies of
    the samples' ``msg_store_index.ets`` and ``file_summary.ets`` (seeded bit flips, inverted,
    zeroed and random runs, cuts; written at test time)."""
    import random
    import subprocess

    from brokers import runtime
    from cqforensics.codecs import etf
    from cqforensics.readers.terms import RAISES, file2tab_load

    need_broker(version)
    rt = runtime(version)
    dumps = sorted(
        p
        for ds in ("3.10.8-clean", "4.3.6-clean", "3.12.14-clean")
        for p in (SAMPLES / ds / "mnesia").rglob("msg_store_persistent/*.ets")
    )
    rnd = random.Random(33)
    work = Path(tempfile_dir(rt.root)) / f"cqf-file2tab-{os.getpid()}"
    work.mkdir(parents=True)
    try:
        cases = {}
        for k in range(240):
            d = bytearray(rnd.choice(dumps).read_bytes())
            kind = ("flip", "invert", "zero", "junk", "cut")[k % 5]
            at, n = rnd.randrange(8, len(d)), rnd.randint(1, 128)
            if kind == "flip":
                d[at] ^= 1 << rnd.randrange(8)
            elif kind == "invert":
                d[at : at + n] = bytes(x ^ 0xFF for x in d[at : at + n])
            elif kind == "zero":
                d[at : at + n] = bytes(len(d[at : at + n]))
            elif kind == "junk":
                d[at : at + n] = bytes(rnd.randrange(256) for _ in d[at : at + n])
            else:
                del d[at:]
            (work / f"{k}.ets").write_bytes(bytes(d))
            cases[f"/{(work / f'{k}.ets').relative_to(rt.root)}"] = bytes(d)
        argv = ["erl", "-noshell", "-eval", ERL_FILE2TAB]
        if rt.chroot:
            argv = ["chroot", str(rt.root), *argv]
        run = subprocess.run(
            argv, input="\n".join(cases) + "\n", capture_output=True, text=True, timeout=300, check=False
        )
        otp = dict(line.split(" ", 1) for line in run.stdout.splitlines() if " " in line)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert len(otp) == len(cases), run.stderr[-2000:]
    differ = []
    for name, data in cases.items():
        objs = file2tab_load(data)
        if objs is None:
            mine = "error"
        elif objs is RAISES:
            mine = "raises"
        else:
            table = {o[1]: o for o in objs}
            keys = sorted(table, key=etf.term_order_key)
            mine = f"{len(table)} {hashlib.md5(etf.term_to_binary(keys)).hexdigest()}"
        if mine != otp[name]:
            differ.append(f"{name}: model {mine}, OTP {otp[name]}")
    kinds = {v.split(" ")[0] if v in ("error", "raises") else "loaded" for v in otp.values()}
    assert not differ and kinds >= {"error", "loaded"}, "\n".join(differ[:10])


def tempfile_dir(root: Path) -> str:
    """A temp dir the runtime rooted at ``root`` sees (its own /tmp for a chroot)."""
    import tempfile

    return str(root / "tmp") if root != Path("/") else tempfile.gettempdir()


#: per file name read from stdin: "<name> <objects> <md5 of the sorted keys' term_to_binary>",
#: "<name> error" or "<name> raises" (file2tab/1 in a process of its own, 10 s at most)
ERL_FILE2TAB = (
    'Loop = fun Loop() -> case io:get_line("") of eof -> ok; Line -> F = string:trim(Line), Self = self(), '
    "P = spawn(fun() -> R = try ets:file2tab(F) of {ok, T} -> Keys = lists:sort([element(2, O) || "
    'O <- ets:tab2list(T)]), io_lib:format("~b ~s", [ets:info(T, size), [io_lib:format("~2.16.0b", [X]) || '
    '<<X>> <= erlang:md5(term_to_binary(Keys))]]); {error, _} -> "error" catch _:_ -> "raises" end, '
    'Self ! {self(), R} end), receive {P, R} -> io:format("~s ~s~n", [F, R]) after 10000 -> exit(P, kill), '
    'io:format("~s hangs~n", [F]) end, Loop() end end, Loop(), halt().'
)
