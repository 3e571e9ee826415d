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
and every queue is drained with time limits, recording what it did."""

from __future__ import annotations

import hashlib
import shutil
import threading
import time
from pathlib import Path

import pytest
from conftest import SAMPLES, manifest, need_broker

RECOVERY_FILES = ("clean.dot", "msg_store_index.ets", "file_summary.ets")


# -- making the cases --------------------------------------------------------------------------------

def vhost_dirs(node: Path) -> list[Path]:
    return sorted(p for p in (node / "msg_stores" / "vhosts").iterdir() if p.is_dir())


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


def root_vhost(node: Path) -> Path:
    for v in vhost_dirs(node):
        if (v / ".vhost").exists() and (v / ".vhost").read_bytes() == b"/":
            return v
    raise AssertionError("no vhost / dir")


def queue_dir(node: Path, name: bytes) -> Path:
    for q in (root_vhost(node) / "queues").iterdir():
        qn = q / ".queue_name"
        if qn.exists() and b"QUEUE: " + name + b"\n" in qn.read_bytes() + b"\n":
            return q
    raise AssertionError(f"no dir for queue {name!r}")


def publish(b, queue: str, n: int, size: int, tag: str) -> None:
    from cqforensics.broker.clients import pika_module

    pika = pika_module()
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(n):
        body = (f"{tag}-{i}-".encode() * (size // 8 + 1))[:size]
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2, message_id=f"{tag}-{i}"))
    conn.close()


def consume(b, queue: str, n: int) -> int:
    from cqforensics.broker.clients import pika_module

    pika = pika_module()
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    got = 0
    for _ in range(n):
        m, _, _ = ch.basic_get(queue, auto_ack=True)
        if m is None:
            break
        got += 1
    conn.close()
    return got


# -- draining with time limits -----------------------------------------------------------------------

def drain_queue(b, vhost: str, queue: str, timeout: float = 15.0, retries: int = 3) -> dict:
    """basic.get + ack until empty, on a fresh connection per attempt. Per queue: ``delivered``
    (all attempts), ``errors`` (reply codes of channel or connection closes, e.g. 541),
    ``hang`` (a get got no answer within ``timeout``), ``events`` (per attempt: count and how it
    ended)."""
    from cqforensics.broker.clients import pika_module

    pika = pika_module()
    rec = {"delivered": 0, "errors": [], "hang": False, "events": [], "bodies": []}
    for attempt in range(retries):
        box = {"n": 0, "end": None, "bodies": []}

        def run(box=box):
            try:
                params = pika.URLParameters(b.url)
                params.virtual_host = vhost
                params.blocked_connection_timeout = timeout
                conn = pika.BlockingConnection(params)
                ch = conn.channel()
                while True:
                    m, _, body = ch.basic_get(queue, auto_ack=False)
                    if m is None:
                        box["end"] = "empty"
                        break
                    box["bodies"].append(hashlib.sha256(body).hexdigest())
                    ch.basic_ack(m.delivery_tag)
                    box["n"] += 1
                conn.close()
            except (pika.exceptions.AMQPError, OSError) as e:  # channel/connection closed by the broker
                code = getattr(e, "reply_code", None)
                if code is None and e.args and isinstance(e.args[0], int):
                    code = e.args[0]
                box["end"] = code if code is not None else type(e).__name__

        t = threading.Thread(target=run, daemon=True)
        t.start()
        last, deadline = -1, time.monotonic() + timeout
        while t.is_alive():  # a hang: no progress for ``timeout`` seconds
            t.join(0.5)
            if box["n"] != last:
                last, deadline = box["n"], time.monotonic() + timeout
            elif time.monotonic() > deadline:
                break
        rec["delivered"] += box["n"]
        rec["bodies"] += box["bodies"]
        if t.is_alive():
            rec["hang"] = True
            rec["events"].append((box["n"], "hang"))
            break
        rec["events"].append((box["n"], box["end"]))
        if box["end"] == "empty":
            break
        rec["errors"].append(box["end"])
        if attempt < retries - 1:  # no attempt follows the last
            time.sleep(2)  # the queue's supervisor restarts it
    return rec


def list_counts(b, vhost: str, timeout: float = 30.0) -> dict[str, object] | str:
    import json
    import subprocess

    try:
        out = b.ctl("list_queues", "-p", vhost, "name", "messages", "--formatter", "json", "-q",
                    "--timeout", str(int(timeout)), timeout=timeout + 10, check=False)
        return {q["name"]: q.get("messages") for q in json.loads(out or "[]")}
    except (subprocess.TimeoutExpired, ValueError) as e:
        return f"list failed: {type(e).__name__}"


def observe(b, vhosts: list[str], amqp10: set, settle: float = 5.0, timeout: float = 15.0,
            restart: frozenset = frozenset()) -> dict:
    """Per (vhost, queue): what ``list_queues`` counted after boot and what draining got.
    ``restart``: vhosts whose crash is predicted. Once such a vhost's message store has crashed,
    the broker restarts the vhost, or sometimes leaves it down (seen once on 3.10.8,
    rdq_missing: a queue's read got 541, the next one hung, every other queue 404 for a minute;
    probably restarts too fast for the vhost's supervisor). A queue left undrained there (no attempt ended empty) is drained again
    after ``rabbitmqctl restart_vhost``, as an operator would: what it then delivers is the
    prediction's ``predicted_after_restart``."""
    time.sleep(settle)
    out = {}
    for vhost in vhosts:
        listed = list_counts(b, vhost)
        if isinstance(listed, str):
            out[(vhost, None)] = {"listed": listed}
            continue
        for name, n in sorted(listed.items()):
            if (vhost, name) in amqp10:
                out[(vhost, name)] = {"listed": n, "amqp10": True}
                continue
            out[(vhost, name)] = {"listed": n, **drain_queue(b, vhost, name, timeout)}
        left = [k for k, v in out.items() if k[0] == vhost and v.get("events") and v["events"][-1][1] != "empty"]
        if vhost in restart and left:
            b.ctl("restart_vhost", "--vhost", vhost, check=False)  # refused when it is running
            time.sleep(settle)
            for key in left:
                rec, again = out[key], drain_queue(b, vhost, key[1], timeout)
                rec["delivered"] += again["delivered"]
                rec["bodies"] += again["bodies"]
                rec["errors"] += again["errors"]
                rec["events"] += [(0, "restart_vhost")] + again["events"]
                rec["hang"] = again["hang"]  # a read left waiting by the crash is not a hang of the queue
    return out


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
            size = int.from_bytes(data[o:o + 4], "big")
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
    raise ValueError(case)


def predicted_bodies(node: Path, version: str) -> tuple[dict, set[str], set[str]]:
    """Per (vhost, queue): sha256 of the bodies fsck predicts the next boot delivers; the
    bodies of messages the recorded store index lacks; the bodies of shared-store messages
    more than one queue holds."""
    import cqforensics

    t = cqforensics.read_table(node, table="messages", broker_version=version,
                               columns=["vhost", "queue", "body", "msg_id", "location", "survives_restart",
                                        "drop_reason"]).to_pylist()
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
@pytest.mark.parametrize("version, case", [(v, c) for v in VERSIONS for c in CASES],
                         ids=[f"{v}-{c}" for v in VERSIONS for c in CASES])
def test_clean_start_on_wrong_state_matches_the_real_broker(version, case, broker_dir):
    """Per queue: what the broker delivered (distinct bodies: a queue that crashes loses the
    acks of what it delivered just before, and delivers those again after its restart) equals
    what fsck predicts; a queue predicted to crash on a read got an error (541), one predicted
    to restart may have, every other queue none; and fsck reports an error finding whenever the
    recorded state is wrong."""
    from cqforensics import fsck
    from cqforensics.broker import Broker

    need_broker(version)
    dataset = f"{version}-clean"
    vhosts = manifest(dataset)["vhosts"]
    with Broker(version, broker_dir / "run") as b:
        b.install_node(SAMPLES / dataset / "mnesia")
        b.start()
        b.stop()  # the broker's own clean stop: its recovery files describe its data
        what = make_case(b, case)
        report = fsck.run(b.node_dir, broker_version=version)
        bodies, unrecorded, shared = predicted_bodies(b.node_dir, version)
        b.start()
        got = observe(b, vhosts, amqp10=set(), restart=frozenset(q.vhost for q in report.queues if q.crash == "vhost"))
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
            out.append(f"{key}: delivered {len(distinct)} distinct, predicted {len(want)}: "
                       f"{len(distinct - want)} unexpected, {len(want - distinct)} missing ({g['events']})")
        if not (restarted or q.vhost in vhost_crash) and (g["errors"] or g["delivered"] != q.predicted_after_restart):
            out.append(f"{key}: predicted {q.predicted_after_restart} without a crash, the broker: {g['events']}")
    return out


def test_store_index_is_read_as_file2tab_loads_it(tmp_path):
    """ets:file2tab (no verify) skips a damaged item and ends the table at a torn item, and the
    start stays clean: the ids it loses are ``not_in_store_index`` (OTP 25's file2tab loaded 30
    of 31 and 12 of 31 objects of these very cuts of a 4.3.6 dump)."""
    from conftest import copy_node

    from cqforensics import fsck
    from cqforensics.readers.terms import file2tab_objects

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
    from conftest import copy_node

    from cqforensics import fsck

    node = copy_node("4.3.6-clean", tmp_path / "a")
    qi = queue_dir(node, b"audit.b") / "0.qi"
    data = bytearray(qi.read_bytes())
    live = [o for o in range(64, len(data) - 31, 32) if data[o] == 1]
    data[live[0]:live[0] + 32] = bytes(32)  # acked: IDX2 zeroes the slot
    qi.write_bytes(bytes(data))
    report = fsck.run(node, broker_version="4.3.6")
    q = next(v for v in report.queues if v.queue == "audit.b")
    assert q.messages == q.predicted_after_restart == len(live) - 1
    hit = [f for f in report.findings if f.code == "recovery-terms-mismatch" and f.queue == "audit.b"]
    assert hit and hit[0].severity == "error" and hit[0].details["restarts"]
