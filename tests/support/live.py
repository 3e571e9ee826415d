"""Talking to a running real broker (brokers/ harness): publish, consume, count and drain with time
limits, and a sample booted and drained whole (compared with its manifest)."""

from __future__ import annotations

import hashlib
import json
import threading
import time

from support import SAMPLES, manifest, need_broker


def publish(b, queue: str, n: int, size: int, tag: str) -> None:
    from brokers.clients import pika_module

    pika = pika_module()
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(n):
        body = (f"{tag}-{i}-".encode() * (size // 8 + 1))[:size]
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2, message_id=f"{tag}-{i}"))
    conn.close()


def consume(b, queue: str, n: int) -> int:
    from brokers.clients import pika_module

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


def drain_queue(b, vhost: str, queue: str, timeout: float = 15.0, retries: int = 3) -> dict:
    """basic.get + ack until empty, on a fresh connection per attempt. Per queue: ``delivered``
    (all attempts), ``errors`` (reply codes of channel or connection closes, e.g. 541),
    ``hang`` (a get got no answer within ``timeout``), ``events`` (per attempt: count and how it
    ended)."""
    return drain_queues(b, vhost, [queue], timeout, retries)[queue]


#: seconds between an attempt on a queue that ended in an error and the next one on that queue:
#: the queue's supervisor restarts it
RETRY_PAUSE = 2.0


def drain_queues(b, vhost: str, queues, timeout: float = 15.0, retries: int = 3) -> dict[str, dict]:
    """``drain_queue`` for each of ``queues`` (of ``vhost``), queue -> its record. One attempt at a
    time, in rounds: every queue once, in order, then every queue whose attempt ended in an error
    again, no sooner than ``RETRY_PAUSE`` after that attempt, and so on, ``retries`` attempts at
    most. Each queue gets the attempts, and the pause before each retry, that ``drain_queue``
    gives it alone; what is shared is the waiting: the pauses of queues that crash overlap the
    attempts on the others (12 queues crashing on every read took 50 s one after another)."""
    from brokers.clients import pika_module

    pika = pika_module()
    recs = {q: {"delivered": 0, "errors": [], "hang": False, "events": [], "bodies": []} for q in queues}
    due = {q: 0.0 for q in queues}  # queue -> monotonic time its next attempt may start
    for _ in range(retries):
        for queue in list(due):
            time.sleep(max(0.0, due.pop(queue) - time.monotonic()))
            rec = recs[queue]
            n, end, bodies = _drain_attempt(pika, b, vhost, queue, timeout)
            rec["delivered"] += n
            rec["bodies"] += bodies
            rec["events"].append((n, end))
            if end == "hang":
                rec["hang"] = True
            elif end != "empty":
                rec["errors"].append(end)
                due[queue] = time.monotonic() + RETRY_PAUSE  # a last failed attempt is not retried
        if not due:
            break
    return recs


def _drain_attempt(pika, b, vhost: str, queue: str, timeout: float) -> tuple[int, object, list[str]]:
    """One attempt of ``drain_queue``: (messages got and acked, how it ended: "empty", "hang" or
    the reply code of the close, sha256 of each body)."""
    box = {"n": 0, "end": None, "bodies": []}

    def run():
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
    n, bodies = box["n"], list(box["bodies"])  # (a thread left hanging may still add to its box)
    return n, "hang" if t.is_alive() else box["end"], bodies


def wait_log_quiet(b, limit: float = 5.0, quiet: float = 2.0) -> float:
    """Wait until the broker ``b`` has written nothing to its log for ``quiet`` seconds (what a
    boot sets off right after its listener opens: the last boot steps, a queue crashing at init
    and restarted, a vhost restarted after its message store crashed, each logs as it happens),
    ``limit`` seconds at most; returns the seconds waited."""
    t0 = time.monotonic()
    size, since = -1, t0
    while (now := time.monotonic()) - t0 < limit:
        try:
            now_size = b.log_file.stat().st_size
        except FileNotFoundError:
            now_size = -1
        if now_size != size:
            size, since = now_size, now
        elif now - since >= quiet:
            break
        time.sleep(0.1)
    return time.monotonic() - t0


def message_counts(b, queues, vhost: str = "/") -> dict[str, int]:
    """Ready messages per queue, from AMQP passive ``queue.declare`` (one connection): what
    ``list_counts`` gives for a queue without consumers or unacked deliveries, without booting a
    rabbitmqctl VM (about 1.2 CPU-seconds a call)."""
    from brokers.clients import pika_module

    pika = pika_module()
    params = pika.URLParameters(b.url)
    params.virtual_host = vhost
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        return {q: ch.queue_declare(q, passive=True).method.message_count for q in queues}
    finally:
        conn.close()


def consume_all(b, vhost: str, queue: str, timeout: float = 60.0, prefetch: int = 1000) -> dict:
    """Every message of ``queue`` (no publisher running) delivered and acked through basic.consume
    with a prefetch window and acks of many at once: a round trip per window, not per message as
    ``drain_queue``'s basic.get (20,000 gets cost about 10 CPU-seconds here and as many in the
    broker). Rounds until a passive declare counts the queue empty. Returns ``delivered``,
    ``errors`` (reply codes of a channel or connection the broker closed) and ``hang`` (no
    delivery for ``timeout`` seconds while the queue still counted messages)."""
    from brokers.clients import pika_module

    pika = pika_module()
    rec = {"delivered": 0, "errors": [], "hang": False}
    params = pika.URLParameters(b.url)
    params.virtual_host = vhost
    try:
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=prefetch)
        while (left := ch.queue_declare(queue, passive=True).method.message_count) > 0:
            got, tag = 0, None
            for method, _, _ in ch.consume(queue, auto_ack=False, inactivity_timeout=timeout):
                if method is None:
                    rec["hang"] = True
                    break
                got, tag = got + 1, method.delivery_tag
                if got % (prefetch // 2) == 0 or got == left:
                    ch.basic_ack(tag, multiple=True)
                if got == left:
                    break
            ch.cancel()  # requeues nothing: every delivery of this round was acked
            rec["delivered"] += got
            if rec["hang"]:
                break
        conn.close()
    except (pika.exceptions.AMQPError, OSError) as e:  # channel/connection closed by the broker
        code = getattr(e, "reply_code", None)
        rec["errors"].append(code if code is not None else type(e).__name__)
    return rec


def list_counts(b, vhost: str, timeout: float = 30.0) -> dict[str, object] | str:
    import json
    import subprocess

    try:
        out = b.ctl(
            "list_queues",
            "-p",
            vhost,
            "name",
            "messages",
            "--formatter",
            "json",
            "-q",
            "--timeout",
            str(int(timeout)),
            timeout=timeout + 10,
            check=False,
        )
        return {q["name"]: q.get("messages") for q in json.loads(out or "[]")}
    except (subprocess.TimeoutExpired, ValueError) as e:
        return f"list failed: {type(e).__name__}"


def comparable(queues: list[dict]) -> dict:
    """Per queue, the delivered messages without the fields a later boot may change."""
    out = {}
    for q in queues:
        msgs = []
        for m in q["messages"]:
            m = {k: v for k, v in m.items() if k != "redelivered"}
            msgs.append(json.dumps(m, sort_keys=True))
        out[(q["vhost"], q["name"])] = msgs
    return out


def boot_and_drain(dataset: str, run_dir, node_dir=None, clean_stop: bool = True) -> list[dict]:
    """Boot the dataset's broker version on a copy (or on ``node_dir``'s mnesia base) and drain it,
    then stop it cleanly, or with ``clean_stop=False`` kill it: for a caller that reads nothing
    the shutdown writes (a clean stop costs a rabbitmqctl VM and the broker's shutdown work)."""
    from brokers import Broker
    from brokers.clients import drain_all

    m = manifest(dataset)
    version = m["broker"]["rabbitmq"]
    need_broker(version)
    settings = m.get("settings") or {}
    adv = None
    if settings:  # ``key``: a rabbit setting; ``app.key``: another application's (ra.wal_max_size_bytes)
        apps: dict[str, list[str]] = {}
        for k, v in settings.items():
            app, _, key = k.rpartition(".")
            apps.setdefault(app or "rabbit", []).append(f"{{{key}, {v}}}")
        adv = "[" + ", ".join(f"{{{app}, [{', '.join(items)}]}}" for app, items in apps.items()) + "].\n"
    known = {
        (q["vhost"], q["name"]): {
            k: v for k, v in q.items() if k in ("vhost", "name", "drain", "index_version", "arguments")
        }
        for q in m["queues"]
        if q.get("exists_after_restart", True)
    }
    with Broker(version, run_dir, advanced_config=adv) as b:
        b.install_node(SAMPLES / dataset / "mnesia" if node_dir is None else node_dir.parent)
        b.start()
        queues = drain_all(b, m["vhosts"], known)
        if clean_stop:
            b.stop()
        else:
            b.kill()
    return queues


def assert_delivers_manifest(dataset: str, got: list[dict]) -> None:
    """Per queue, in order, the messages the original delivered (redelivered flags aside)."""
    existing = [q for q in manifest(dataset)["queues"] if q.get("exists_after_restart", True)]
    assert comparable([q for q in got if q.get("exists_after_restart", True)]) == comparable(existing)
