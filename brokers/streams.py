"""The stream workload of the sample generator and the broker-backed tests, and the ground
truth read back from a real broker.

Writes, on one broker with the ``rabbitmq_stream`` plugin:

* over AMQP 0-9-1: ``MESSAGES_091`` messages to the topic exchange ``ex.streams``, bound to the
  streams ``st.events`` and ``st.retained`` and the classic queue ``cq.events`` (every 7th with
  properties and typed headers). ``st.events`` rolls a segment every ``SEGMENT_BYTES`` (several
  segments: tracking snapshots at their starts); ``st.retained`` keeps at most ``RETAINED_BYTES``
  (retention deletes its first segments: it starts above offset 0);
* over the stream protocol (``rstream``), to ``st.events``: ``SIMPLE`` simple entries from
  publisher ``pub-1`` (publishing ids: its sequence is tracked), one sub-batch of ``SUB_BATCH``
  records per compression (none, gzip, snappy, lz4, zstd), consumer ``cons-2`` storing an offset
  halfway through the AMQP 0-9-1 messages (before segments roll: kept by the snapshots) and
  ``cons-1`` storing ``STORED_OFFSET`` then ``STORED_OFFSET + 5`` (tracking delta chunks);
* over AMQP 1.0 (4.x), to ``st.events``: ``MESSAGES_10`` messages with properties and
  application properties.

``ground_truth`` reads back, per stream, what the broker serves from offset ``first`` over the
stream protocol (every chunk the broker sends, its CRC checked here, every record with its
offset and the sha256 of its bytes, and its AMQP 1.0 sections decoded by rstream's own AMQP
decoder) and over AMQP 0-9-1 (``x-stream-offset: first``, every delivery acked as it comes:
the consumer ``model.recovery.amqp091_read`` predicts; once with prefetch ``PREFETCH`` and once
with prefetch 1: when a read fails the consumer's channel, deliveries still in flight are lost
with the connection, a number that varies from run to run with prefetch 100 and is nil with
prefetch 1), and the tracking the broker reports for every reference found on disk
(``QueryOffset``, ``QueryPublisherSequence``), after waiting for the stream to be available (its
member starts after the boot).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import hashlib
import threading
import time
import uuid

STREAM, RETAINED, CLASSIC, EXCHANGE = "st.events", "st.retained", "cq.events", "ex.streams"
SEGMENT_BYTES, RETAINED_BYTES, RETAINED_SEGMENT_BYTES = 32_000, 20_000, 8_000
#: queue arguments of each stream of the workload
STREAMS = {
    STREAM: {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": SEGMENT_BYTES},
    RETAINED: {
        "x-queue-type": "stream",
        "x-max-length-bytes": RETAINED_BYTES,
        "x-stream-max-segment-size-bytes": RETAINED_SEGMENT_BYTES,
    },
}
MESSAGES_091, SIMPLE, SUB_BATCH, MESSAGES_10 = 400, 30, 10, 20
PUBLISHER, CONSUMER, EARLY_CONSUMER, STORED_OFFSET, EARLY_OFFSET = "pub-1", "cons-1", "cons-2", 100, 50
COMPRESSIONS = ("No", "Gzip", "Snappy", "Lz4", "Zstd")
PREFETCH = 100  # the AMQP 0-9-1 consumer of the ground truth (model.recovery.AMQP091_PREFETCH)


def _codecs():
    """Register snappy (framed), lz4 (frame) and zstd codecs with rstream, in the formats of
    the reference Java client (``compression/CompressionUtils.java``); rstream has gzip only."""
    import cramjam
    from rstream.compression import CompressionType, ICompressionCodec, StreamCompressionCodecs
    from rstream.utils import RawMessage

    def codec(kind, mod):
        class Codec(ICompressionCodec):
            def __init__(self):
                self.buffer, self.n, self.ulen = b"", 0, 0

            def compress(self, messages):
                raw = b""
                for m in messages:
                    b = bytes(RawMessage(m) if isinstance(m, bytes) else m)
                    raw += len(b).to_bytes(4, "big") + b
                self.n, self.ulen = len(messages), len(raw)
                self.buffer = bytes(mod.compress(raw))

            def uncompress(self, compressed_data, uncompressed_data_size):
                return bytes(mod.decompress(compressed_data))

            def compressed_size(self):
                return len(self.buffer)

            def uncompressed_size(self):
                return self.ulen

            def messages_count(self):
                return self.n

            def compression_type(self):
                return kind.value

            def data(self):
                return self.buffer

        return Codec()

    StreamCompressionCodecs.register_codec(CompressionType.Snappy, codec(CompressionType.Snappy, cramjam.snappy))
    StreamCompressionCodecs.register_codec(CompressionType.Lz4, codec(CompressionType.Lz4, cramjam.lz4))
    StreamCompressionCodecs.register_codec(CompressionType.Zstd, codec(CompressionType.Zstd, cramjam.zstd))


def _stream_client(broker, kind):
    return kind("127.0.0.1", port=broker.stream_port, username="guest", password="guest")


def declare(ch, streams: dict = STREAMS, classic: bool = True) -> None:
    """Declare the exchange, ``streams`` and (``classic``) the classic queue, each bound with ``ev.#``."""
    ch.exchange_declare(EXCHANGE, "topic", durable=True)
    for name, args in streams.items():
        ch.queue_declare(name, durable=True, arguments=args)
    if classic:
        ch.queue_declare(CLASSIC, durable=True)
    for q in (*streams, *((CLASSIC,) if classic else ())):
        ch.queue_bind(q, EXCHANGE, "ev.#")


def publish_091(ch, start: int, stop: int) -> None:
    from brokers.clients import ALL_TYPES, pika_module

    pika = pika_module()
    HEADERS = {k: v for k, v in ALL_TYPES.items() if k != "decimal"}  # 4.3.6: a decimal header fails the
    # publishing channel (541) when the message goes to a stream (seen; classic queues take it)

    for i in range(start, stop):
        props = pika.BasicProperties(delivery_mode=2)
        if i % 7 == 0:  # every property, and headers of every field type
            props = pika.BasicProperties(
                delivery_mode=2,
                content_type="application/json",
                content_encoding="identity",
                message_id=f"m-{i}",
                correlation_id=f"c-{i}",
                priority=i % 10,
                timestamp=1_700_000_000 + i,
                type="event",
                app_id="gen",
                expiration="86400000",
                reply_to="replies",
                user_id="guest",
                cluster_id="cluster-a",
                headers=dict(HEADERS, seq=i),
            )
        ch.basic_publish(EXCHANGE, f"ev.{i % 5}", f'{{"event": {i}}}'.encode() * (1 + i % 3), props)


def write(broker, amqp10: bool, streams: dict = STREAMS) -> dict:
    """Run the workload; returns what was sent (counts, per protocol)."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.confirm_delivery()
    declare(ch, streams)
    publish_091(ch, 0, MESSAGES_091 // 2)
    asyncio.run(_store_offsets(broker, [(EARLY_CONSUMER, EARLY_OFFSET)]))
    publish_091(ch, MESSAGES_091 // 2, MESSAGES_091)
    conn.close()
    asyncio.run(_stream_protocol(broker))
    asyncio.run(_store_offsets(broker, [(CONSUMER, STORED_OFFSET), (CONSUMER, STORED_OFFSET + 5)]))
    if amqp10:
        _amqp10(broker)
    return {
        "amqp091": MESSAGES_091,
        "stream_simple": SIMPLE,
        "sub_batches": {c: SUB_BATCH for c in COMPRESSIONS},
        "amqp10": MESSAGES_10 if amqp10 else 0,
        "streams": {k: dict(v) for k, v in streams.items()},
    }


def write_many(broker, names, messages: int = 130, segment_bytes: int = 8_000) -> None:
    """The damage tests' workload, the same in every stream of ``names`` (each rolling a segment
    every ``segment_bytes``): ``messages`` AMQP 0-9-1 publishes fanned out to all of them, then
    per stream over the stream protocol 10 simple entries from ``PUBLISHER``, one gzip sub-batch
    of 5 records, and ``CONSUMER`` storing offset 20."""
    from brokers.clients import pika_module

    pika = pika_module()
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.confirm_delivery()
    declare(
        ch,
        {n: {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": segment_bytes} for n in names},
        classic=False,
    )
    publish_091(ch, 0, messages)
    conn.close()

    async def run():
        from rstream import AMQPMessage, CompressionType, Consumer, Producer

        async with _stream_client(broker, Producer) as p:
            for n in names:
                for i in range(10):
                    await p.send_wait(n, AMQPMessage(body=f"simple {i}".encode()), publisher_name=PUBLISHER)
                await p.send_sub_entry(
                    n,
                    [AMQPMessage(body=f"gz {i} ".encode() * 4) for i in range(5)],
                    compression_type=CompressionType.Gzip,
                    publisher_name=PUBLISHER,
                )
            await asyncio.sleep(1)
        async with _stream_client(broker, Consumer) as c:
            for n in names:
                await c.store_offset(n, CONSUMER, 20)
            await asyncio.sleep(1)

    asyncio.run(run())


async def _stream_protocol(broker) -> None:
    from rstream import AMQPMessage, CompressionType, Producer

    _codecs()
    async with _stream_client(broker, Producer) as p:
        for i in range(SIMPLE):
            await p.send_wait(STREAM, AMQPMessage(body=f"simple {i}".encode()), publisher_name=PUBLISHER)
        for c in COMPRESSIONS:
            await p.send_sub_entry(
                STREAM,
                [AMQPMessage(body=f"{c} {i} ".encode() * 8) for i in range(SUB_BATCH)],
                compression_type=getattr(CompressionType, c),
                publisher_name=PUBLISHER,
            )
        await asyncio.sleep(1)


async def _store_offsets(broker, stores) -> None:
    from rstream import Consumer

    async with _stream_client(broker, Consumer) as c:
        for ref, offset in stores:
            await c.store_offset(STREAM, ref, offset)
            await asyncio.sleep(0.5)  # each its own tracking delta chunk


def _amqp10(broker) -> None:
    from brokers.clients import amqp10_connection, proton

    p = proton()
    c = amqp10_connection(broker.port, "/")
    snd = c.create_sender(f"/queues/{STREAM}")
    for i in range(MESSAGES_10):
        snd.send(
            p.Message(
                body=f"amqp10 {i}".encode(),
                inferred=True,
                durable=True,
                id=f"a10-{i}",
                subject="subj",
                content_type=p.symbol("text/plain"),
                application_properties={"k": i, "t": "x"},
            )
        )
    snd.close()
    c.close()


# -- ground truth --------------------------------------------------------------------------------


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def jsonable(v):
    """An AMQP 1.0 value as rstream's decoder returns it, as JSON (bytes as UTF-8 text or
    base64, times as ms since the epoch, maps with text keys)."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(b).decode()}
    if isinstance(v, dict):
        return {str(jsonable(k)): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, datetime.datetime):
        return int(v.timestamp() * 1000)
    if isinstance(v, uuid.UUID):
        return str(v)
    if hasattr(v, "_asdict"):  # the decoder's named tuples (properties, header)
        return {k: jsonable(x) for k, x in v._asdict().items()}
    if hasattr(v, "__dict__") and not isinstance(v, type):
        return {k: jsonable(x) for k, x in vars(v).items() if not k.startswith("_")}
    return v


def sections(body: bytes) -> dict:
    """The AMQP 1.0 sections of a record as a stream-protocol client decodes them
    (``rstream.amqp.amqp_decoder``)."""
    from rstream.amqp import amqp_decoder

    try:
        m = amqp_decoder(bytes(body))
    except Exception as e:  # not an AMQP 1.0 message: that is the truth too
        return {"error": f"{type(e).__name__}: {str(e)[:120]}"}
    return {
        "header": jsonable(getattr(m, "header", None)),
        "message_annotations": jsonable(getattr(m, "message_annotations", None)),
        "properties": jsonable(getattr(m, "properties", None)),
        "application_properties": jsonable(getattr(m, "application_properties", None)),
    }


#: ``_raw_chunks``' patch of rstream: installed while any thread reads, each thread recording
#: into its own list (reads of several streams may run at once, each in a thread of its own)
_patch = {"users": 0, "lock": threading.Lock(), "local": threading.local(), "saved": None}


@contextlib.contextmanager
def _raw_chunks(chunks: list):
    """Record every chunk the broker delivers over the stream protocol (chunk id, records, CRC
    valid) before rstream's own handling, which drops the connection at a chunk whose CRC fails
    (``schema.Deliver``): what the broker sent is the truth, whatever a client does with it.
    The chunks a thread's subscriptions get go to the ``chunks`` of that thread."""
    import zlib

    from rstream import consumer as rc
    from rstream import schema

    local = _patch["local"]
    with _patch["lock"]:
        if _patch["users"] == 0:
            post_init, on_deliver = schema.Deliver.__post_init__, rc.Consumer._on_deliver
            _patch["saved"] = post_init, on_deliver

            def lenient(self):
                self._cqf_crc_ok = zlib.crc32(self.data) == self.chunk_crc
                self.chunk_crc = zlib.crc32(self.data)  # rstream then takes the chunk as it is

            async def recording(self, frame, subscriber, filter_value):
                sink = getattr(local, "chunks", None)
                if sink is not None:
                    sink.append(
                        [
                            frame.chunk_first_offset,
                            frame.num_records,
                            frame.num_entries,
                            getattr(frame, "_cqf_crc_ok", True),
                        ]
                    )
                await on_deliver(self, frame, subscriber, filter_value)

            schema.Deliver.__post_init__, rc.Consumer._on_deliver = lenient, recording
        _patch["users"] += 1
    local.chunks = chunks
    try:
        yield
    finally:
        local.chunks = None
        with _patch["lock"]:
            _patch["users"] -= 1
            if _patch["users"] == 0:
                schema.Deliver.__post_init__, rc.Consumer._on_deliver = _patch["saved"]


def wait_available(broker, stream: str, limit: float = 90.0) -> str | None:
    """Wait until the broker answers for ``stream`` (its member starts after the boot: until
    then the stream protocol says stream_not_available and rstream's producer hangs); None
    when it does, else the last answer."""
    from rstream import Consumer
    from rstream.exceptions import ServerError, StreamDoesNotExist, StreamNotAvailable

    async def once():
        async with _stream_client(broker, Consumer) as c:
            client = await c.default_client
            try:
                await asyncio.wait_for(client.query_offset(stream, "cqforensics-probe"), 10)
            except (StreamNotAvailable, StreamDoesNotExist):
                raise
            except ServerError:  # no offset stored under that name: the stream answers
                pass

    deadline = time.monotonic() + limit
    last = None
    while time.monotonic() < deadline:
        try:
            asyncio.run(asyncio.wait_for(once(), 20))
            return None
        except Exception as e:
            last = f"{type(e).__name__}: {str(e)[:200]}"
            time.sleep(1)
    return last


def served_stream_protocol(broker, stream: str = STREAM, idle: float = 2.0, limit: float = 60.0) -> dict:
    """What the broker serves from ``first`` over the stream protocol: ``chunks`` [chunk id,
    records, entries, CRC valid] as sent, ``records`` [offset, sha256, length] in delivery order
    and ``sections`` (offset -> AMQP 1.0 sections), or ``error`` when the broker refuses the
    subscription or the connection fails."""
    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType

    _codecs()
    out: list = []
    chunks: list = []
    secs: dict = {}
    last = [time.monotonic()]

    async def run():
        c = _stream_client(broker, Consumer)
        await c.start()

        def cb(body, ctx):
            out.append([ctx.offset, _sha(bytes(body)), len(body)])
            secs[str(ctx.offset)] = sections(bytes(body))
            last[0] = time.monotonic()

        try:
            await asyncio.wait_for(
                c.subscribe(
                    stream,
                    cb,
                    decoder=lambda b: b,
                    initial_credit=50,
                    offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None),
                ),
                15,
            )
            t0 = time.monotonic()
            while time.monotonic() - last[0] < idle and time.monotonic() - t0 < limit:
                await asyncio.sleep(0.2)
        finally:
            try:  # rstream's close can wait forever on an unsubscribe answer: bounded
                await asyncio.wait_for(c.close(), 5)
            except Exception:
                pass

    error = None
    with _raw_chunks(chunks):
        try:
            asyncio.run(asyncio.wait_for(run(), limit + 10))
        except Exception as e:  # the broker's answer (an error) is part of the truth
            error = f"{type(e).__name__}: {str(e)[:200]}"
    return {"chunks": chunks, "records": out, "sections": secs, **({"error": error} if error else {})}


def served_amqp091(
    broker, stream: str = STREAM, idle: float = 2.0, limit: float = 60.0, prefetch: int = PREFETCH
) -> dict:
    """Every message served from ``first`` over AMQP 0-9-1 (``x-stream-offset``, prefetch
    ``prefetch``, each delivery acked as it comes), in delivery order, with what a 0-9-1
    consumer sees; ``error`` when the broker closed the channel or connection on us."""
    from brokers.clients import pika_module, record_091  # the drains' own recording

    pika = pika_module()

    out: list = []
    error = None
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=prefetch)
        t0 = last = time.monotonic()
        for method, props, body in ch.consume(stream, arguments={"x-stream-offset": "first"}, inactivity_timeout=0.25):
            if method is None:
                if time.monotonic() - last > idle or time.monotonic() - t0 > limit:
                    break
                continue
            last = time.monotonic()
            rec = record_091(method, props, body)
            rec["offset"] = (props.headers or {}).get("x-stream-offset")
            out.append(rec)
            ch.basic_ack(method.delivery_tag)
    except Exception as e:  # a channel the broker closed (e.g. a CRC failure on 3.10) is an answer
        error = f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        try:
            conn.close()
        except Exception:
            pass
    return {"prefetch": prefetch, "messages": out, **({"error": error} if error else {})}


def references(stream_dir) -> dict:
    """The tracking references on disk of a stream dir (read with cqforensics' own reader:
    the questions to ask the broker; the answers are the broker's)."""
    from cqforensics.readers import osiris

    scan = osiris.read_stream(stream_dir)
    refs = {"offset": set(), "sequence": set()}
    for t in scan.tracking:
        if t.kind in refs:
            refs[t.kind].add(t.reference.decode("utf-8", "replace"))
    return {k: sorted(v) for k, v in refs.items()}


def tracking(broker, stream: str, refs: dict) -> dict:
    """The consumer offset of every ``refs["offset"]`` reference and the publisher sequence of
    every ``refs["sequence"]`` reference as the broker reports them; ``None`` where the broker
    answers that it has none (the response code is kept in ``codes``)."""
    from rstream import Consumer, schema
    from rstream.exceptions import ServerError

    async def run():
        res = {"consumer_offsets": {}, "publisher_sequences": {}, "codes": {}}
        async with _stream_client(broker, Consumer) as c:
            client = await c.default_client
            for ref in refs.get("offset", []):
                try:
                    res["consumer_offsets"][ref] = await asyncio.wait_for(client.query_offset(stream, ref), 10)
                except ServerError as e:
                    res["consumer_offsets"][ref] = None
                    res["codes"][f"offset:{ref}"] = type(e).__name__
            for ref in refs.get("sequence", []):
                resp = await asyncio.wait_for(
                    client.sync_request(
                        schema.QueryPublisherSequence(client._corr_id_seq.next(), publisher_ref=ref, stream=stream),
                        resp_schema=schema.QueryPublisherSequenceResponse,
                        raise_exception=False,
                    ),
                    10,
                )
                ok = resp.response_code == 1
                res["publisher_sequences"][ref] = resp.sequence if ok else None
                if not ok:
                    res["codes"][f"sequence:{ref}"] = resp.response_code
        return res

    try:
        return asyncio.run(asyncio.wait_for(run(), 120))
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}


def stream_truth(
    broker, stream: str, refs: dict, limit: float = 90.0, prefetch_100: bool = True, idle: float = 2.0
) -> dict:
    """Everything ``ground_truth`` records for one stream (``limit``: how long to wait for it to
    be available; ``prefetch_100``: also the AMQP 0-9-1 read with prefetch ``PREFETCH``;
    ``idle``: a read ends after that many seconds without a delivery)."""
    waited = wait_available(broker, stream, limit)
    return {
        "stream": stream,
        "vhost": "/",
        "available": waited is None,
        **({"unavailable": waited} if waited else {}),
        "tracking": tracking(broker, stream, refs) if waited is None else {"error": waited},
        "served_stream_protocol": served_stream_protocol(broker, stream, idle=idle),
        **({"served_amqp091": served_amqp091(broker, stream, idle=idle)} if prefetch_100 else {}),
        "served_amqp091_one": served_amqp091(broker, stream, idle=idle, prefetch=1),
    }


def ground_truth(broker, node_dir) -> list[dict]:
    """Per stream of the workload: the truth read from ``broker`` (booted on the node dir whose
    pre-boot copy is ``node_dir``: the tracking references are read from it)."""
    from pathlib import Path

    from cqforensics.model.vhost import base64uri

    out = []
    for name in STREAMS:
        prefix = base64uri(f"/_{name}_")
        dirs = [d for d in (Path(node_dir) / "stream").glob(prefix + "*") if d.name[len(prefix) :].isdigit()]
        refs = references(dirs[0]) if len(dirs) == 1 else {}
        out.append(stream_truth(broker, name, refs))
    return out
