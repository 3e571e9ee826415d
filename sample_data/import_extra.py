"""Import a node dir written by a broker that cannot be installed here (3.12, 3.13, 4.1, 4.2) as a
dataset: ``python sample_data/import_extra.py SRC_FOLDER...`` copies ``SRC/NAME.tar.gz`` to
``sample_data/<rabbitmq version of SRC/version.txt>-clean/`` and converts ``SRC/truth.json`` into ``manifest.json``.

truth.json records headers as the client library decoded them; they are typed here by the
rules the publisher and the broker encode them with (see sample_data/README.md):
  * str -> longstr, bool -> bool, None -> void, dict -> table, list -> array,
    {"bytes_hex": h} -> binary, int -> signedint when it fits 32 bits, else long
    (the rules of pika's table encoder, pika/data.py encode_value; the stored bytes agree,
    tests/model/test_oracle.py compares them);
  * the scenario's ``dec`` header (text of a Python Decimal) -> decimal, its ``ts`` header and
    x-death ``time`` (ISO text) -> timestamp;
  * x-death ``count`` -> long (rabbit_dead_letter / mc_amqpl write it as ``long``).
Queue arguments and index versions are not in truth.json: they are taken from the node's own
durable-queue metadata (Mnesia or Khepri) as the broker wrote it.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import gzip
import hashlib
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROPS = ("content_type", "delivery_mode", "priority", "message_id", "timestamp", "expiration")


def _ts(text: str) -> int:
    return int(datetime.datetime.fromisoformat(text).timestamp())


def typed(value, key: str | None = None, in_death: bool = False) -> dict:
    if in_death and key == "count":
        return {"type": "long", "value": value}
    if in_death and key == "time" or key == "ts":
        return {"type": "timestamp", "value": _ts(value)}
    if key == "dec":
        d = decimal.Decimal(value)
        sign, digits, exp = d.as_tuple()
        scale = -exp
        return {"type": "decimal", "value": {"scale": scale, "value": int(d.scaleb(scale))}}
    if value is None:
        return {"type": "void", "value": None}
    if isinstance(value, bool):
        return {"type": "bool", "value": value}
    if isinstance(value, int):
        return {"type": "signedint" if -(2**31) <= value < 2**31 else "long", "value": value}
    if isinstance(value, float):
        return {"type": "double", "value": value}
    if isinstance(value, str):
        return {"type": "longstr", "value": value}
    if isinstance(value, dict) and set(value) == {"bytes_hex"}:
        return {"type": "binary", "base64": base64.b64encode(bytes.fromhex(value["bytes_hex"])).decode()}
    if isinstance(value, dict):
        return {"type": "table", "value": {k: typed(v, k, in_death) for k, v in value.items()}}
    if isinstance(value, list):
        death = key == "x-death"
        return {"type": "array", "value": [typed(v, None, in_death or death) for v in value]}
    raise TypeError(f"unexpected header value {value!r}")


def _arg(v):
    return v.decode() if isinstance(v, bytes) else v


def _dump(manifest: dict) -> str:
    """Compact JSON, one message per line (the typed headers make an indented file 4 MB)."""

    def one(v):
        return json.dumps(v, sort_keys=True, ensure_ascii=False, separators=(",", ":"))

    head = {k: v for k, v in manifest.items() if k != "queues"}
    lines = ["{" + one(head)[1:-1] + ',"queues":[']
    for n, q in enumerate(manifest["queues"]):
        qhead = one({k: v for k, v in q.items() if k != "messages"})[:-1]
        msgs = ",\n".join(one(m) for m in q["messages"])
        lines.append(qhead + ',"messages":[\n' + msgs + "]}" + ("," if n < len(manifest["queues"]) - 1 else ""))
    return "\n".join(lines) + "]}\n"


def convert(src: Path) -> Path:
    from cqforensics.readers.metadata import read_metadata

    tarball = next(src.glob("*.tar.gz"))
    ver = dict(line.split(None, 1) for line in (src / "version.txt").read_text().splitlines() if line.strip())
    version = ver["rabbitmq"].strip()
    dataset = f"{version}-clean"
    truth = json.loads((src / "truth.json").read_text())
    out = HERE / dataset
    out.mkdir(exist_ok=True)
    shutil.copy2(tarball, out / tarball.name)
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(tarball) as tf:
        tf.extractall(tmp, filter="data")
        node = next(Path(tmp).iterdir())
        meta = read_metadata(node)
        node_name = node.name
        queues = []
        for (vh, name), rec in sorted(meta.queues.items()):
            args = {k: _arg(v) for k, v in sorted(meta.arguments(vh, name).items())}
            vhost, qname = vh.decode(), name.decode()
            msgs = []
            for t in truth.get(f"{vhost}|{qname}", []):
                msgs.append(
                    {
                        "body_len": t["len"],
                        "body_sha256": t["sha256"],
                        "exchange": t["exchange"],
                        "routing_key": t["routing_key"],
                        "redelivered": t["redelivered"],
                        "properties": {k: t[k] for k in PROPS},
                        "headers": None if t["headers"] is None else {k: typed(v, k) for k, v in t["headers"].items()},
                        "protocol": "amqp091",
                    }
                )
            queues.append(
                {
                    "vhost": vhost,
                    "name": qname,
                    "durable": rec.durable,
                    "index_version": args.get("x-queue-version", 2),
                    "arguments": args,
                    "drain": "amqp091",
                    "exists_after_restart": True,
                    "messages": msgs,
                }
            )
    known = {f"{q['vhost']}|{q['name']}" for q in queues}
    missing = [k for k, v in truth.items() if isinstance(v, list) and k not in known]
    if missing:
        raise SystemExit(f"queues in truth.json unknown to the metadata: {missing}")
    manifest = {
        "broker": {
            "rabbitmq": version,
            "otp": ver["otp"].strip(),
            "package": "not installable here; node dir imported (see README.md)",
        },
        "dataset": dataset,
        "archive": tarball.name,
        "archive_sha256": hashlib.sha256(tarball.read_bytes()).hexdigest(),
        "node": node_name,
        "node_dir": f"mnesia/{node_name}",
        "profile": "extra",
        "properties_recorded": list(PROPS),
        "queues": queues,
        "restarted_at_ms": truth["snapshot_ms"],
        "settings": {},
        "stop": truth["stop_mode"],
        "vhosts": sorted({q["vhost"] for q in queues}),
    }
    # gzip (no name, no mtime: the bytes depend on the content only); the JSON is 2 MB of typed headers
    (out / "manifest.json.gz").write_bytes(gzip.compress(_dump(manifest).encode(), mtime=0))
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    for arg in sys.argv[1:]:
        print(convert(Path(arg)))
