"""The stream workload of the sample generator and the broker-backed tests, and the ground
truth read back from a real broker.

Writes, on one broker with the ``rabbitmq_stream`` plugin:

* over AMQP 0-9-1: ``MESSAGES_091`` messages to the topic exchange ``ex.streams``, bound to the
  stream ``st.events`` and the classic queue ``cq.events`` (every 7th with properties and
  headers);
* over the stream protocol (``rstream``): ``SIMPLE`` simple entries from publisher ``pub-1``
  (publishing ids: its sequence is tracked), one sub-batch of ``SUB_BATCH`` records per
  compression (none, gzip, snappy, lz4, zstd), and consumer ``cons-1`` storing offset
  ``STORED_OFFSET`` then ``STORED_OFFSET + 5`` (tracking delta chunks);
* over AMQP 1.0 (4.x): ``MESSAGES_10`` messages to the stream with properties and application
  properties.

``ground_truth`` reads back what the broker serves from offset ``first``: over the stream
protocol (every record with its offset, sha256 of the entry bytes) and over AMQP 0-9-1 with
``x-stream-offset: first`` (offset, exchange, routing key, properties, headers, body), and the
consumer offsets and publisher sequences the broker reports (QueryOffset,
QueryPublisherSequence).
"""

from __future__ import annotations

import asyncio
import hashlib
import time

STREAM, CLASSIC, EXCHANGE = "st.events", "cq.events", "ex.streams"
MESSAGES_091, SIMPLE, SUB_BATCH, MESSAGES_10 = 400, 30, 10, 20
PUBLISHER, CONSUMER, STORED_OFFSET = "pub-1", "cons-1", 100
COMPRESSIONS = ("No", "Gzip", "Snappy", "Lz4", "Zstd")


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


def write(broker, amqp10: bool) -> dict:
    """Run the workload; returns what was sent (counts, per protocol)."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare(EXCHANGE, "topic", durable=True)
    ch.queue_declare(STREAM, durable=True, arguments={"x-queue-type": "stream"})
    ch.queue_declare(CLASSIC, durable=True)
    for q in (STREAM, CLASSIC):
        ch.queue_bind(q, EXCHANGE, "ev.#")
    for i in range(MESSAGES_091):
        props = pika.BasicProperties(delivery_mode=2)
        if i % 7 == 0:
            props = pika.BasicProperties(delivery_mode=2, content_type="application/json", message_id=f"m-{i}",
                                         correlation_id=f"c-{i}", priority=3, timestamp=1_700_000_000 + i,
                                         type="event", app_id="gen", headers={"i": i, "s": f"v{i}", "b": True})
        ch.basic_publish(EXCHANGE, f"ev.{i % 5}", f'{{"event": {i}}}'.encode() * (1 + i % 3), props)
    conn.close()
    asyncio.run(_stream_protocol(broker))
    if amqp10:
        _amqp10(broker)
    return {"amqp091": MESSAGES_091, "stream_simple": SIMPLE, "sub_batches": {c: SUB_BATCH for c in COMPRESSIONS},
            "amqp10": MESSAGES_10 if amqp10 else 0}


async def _stream_protocol(broker) -> None:
    from rstream import AMQPMessage, CompressionType, Consumer, Producer

    _codecs()
    async with Producer("127.0.0.1", port=broker.stream_port, username="guest", password="guest") as p:
        for i in range(SIMPLE):
            await p.send_wait(STREAM, AMQPMessage(body=f"simple {i}".encode()), publisher_name=PUBLISHER)
        for c in COMPRESSIONS:
            await p.send_sub_entry(STREAM, [AMQPMessage(body=f"{c} {i} ".encode() * 8) for i in range(SUB_BATCH)],
                                   compression_type=getattr(CompressionType, c), publisher_name=PUBLISHER)
        await asyncio.sleep(1)
    async with Consumer("127.0.0.1", port=broker.stream_port, username="guest", password="guest") as c:
        await c.store_offset(STREAM, CONSUMER, STORED_OFFSET)
        await asyncio.sleep(0.5)
        await c.store_offset(STREAM, CONSUMER, STORED_OFFSET + 5)
        await asyncio.sleep(0.5)


def _amqp10(broker) -> None:
    from cqforensics.broker.clients import amqp10_connection, proton

    p = proton()
    c = amqp10_connection(broker.port, "/")
    snd = c.create_sender(f"/queues/{STREAM}")
    for i in range(MESSAGES_10):
        snd.send(p.Message(body=f"amqp10 {i}".encode(), inferred=True, durable=True, id=f"a10-{i}", subject="subj",
                           content_type=p.symbol("text/plain"), application_properties={"k": i, "t": "x"}))
    snd.close()
    c.close()


# -- ground truth --------------------------------------------------------------------------------


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def served_stream_protocol(broker, idle: float = 3.0, limit: float = 60.0) -> dict:
    """Every record served from ``first`` over the stream protocol: [offset, sha256, length]
    in delivery order, or ``{"error": ...}`` when the broker refuses the subscription."""
    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType

    _codecs()
    out: list = []
    last = [time.monotonic()]

    async def run():
        c = Consumer("127.0.0.1", port=broker.stream_port, username="guest", password="guest")
        await c.start()

        def cb(body, ctx):
            out.append([ctx.offset, _sha(bytes(body)), len(body)])
            last[0] = time.monotonic()

        try:
            await asyncio.wait_for(c.subscribe(STREAM, cb, decoder=lambda b: b, initial_credit=50,
                                               offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST,
                                                                                                None)), 15)
            t0 = time.monotonic()
            while time.monotonic() - last[0] < idle and time.monotonic() - t0 < limit:
                await asyncio.sleep(0.2)
        finally:
            try:  # rstream's close can wait forever on an unsubscribe answer: bounded
                await asyncio.wait_for(c.close(), 5)
            except Exception:
                pass

    error = None
    for _ in range(3):  # right after a boot the first subscription may go unanswered: a fresh try
        out.clear()
        last[0] = time.monotonic()
        try:
            asyncio.run(asyncio.wait_for(run(), limit + 10))
            error = None
            break
        except Exception as e:  # the broker's answer (an error) is part of the truth
            error = f"{type(e).__name__}: {str(e)[:200]}"
            if out:
                break
            time.sleep(3)
    return {"records": out, **({"error": error} if error else {})}


def served_amqp091(broker, idle: float = 3.0, limit: float = 60.0) -> dict:
    """Every message served from ``first`` over AMQP 0-9-1 (``x-stream-offset``), in delivery
    order, with what a 0-9-1 consumer sees; ``error`` when the channel was closed on us."""
    from cqforensics.broker.clients import pika_module, record_091  # the drains' own recording

    pika = pika_module()

    out: list = []
    error = None
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)
        t0 = last = time.monotonic()
        for method, props, body in ch.consume(STREAM, arguments={"x-stream-offset": "first"}, inactivity_timeout=0.5):
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
    return {"messages": out, **({"error": error} if error else {})}


def tracking(broker) -> dict:
    """The consumer offset and publisher sequence the broker reports (or null when unknown)."""
    from rstream import Consumer, Producer

    async def run():
        res = {}
        async with Consumer("127.0.0.1", port=broker.stream_port, username="guest", password="guest") as c:
            for attempt in range(5):  # right after a boot the writer may not answer yet
                try:
                    res["consumer_offsets"] = {CONSUMER: await c.query_offset(STREAM, CONSUMER)}
                    break
                except Exception as e:
                    res["consumer_offsets"] = {CONSUMER: None, "error": f"{type(e).__name__}: {str(e)[:200]}"}
                    await asyncio.sleep(2)
        async with Producer("127.0.0.1", port=broker.stream_port, username="guest", password="guest") as p:
            client = await p.default_client
            res["publisher_sequences"] = {PUBLISHER: await client.query_publisher_sequence(STREAM, PUBLISHER)}
        return res

    try:
        return asyncio.run(asyncio.wait_for(run(), 60))
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}


def ground_truth(broker) -> dict:
    tracked = tracking(broker)  # first: it answers once the stream's writer is up
    return {"stream": STREAM, "vhost": "/", "served_stream_protocol": served_stream_protocol(broker),
            "served_amqp091": served_amqp091(broker), "tracking": tracked}
