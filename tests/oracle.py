"""Compare the readers' prediction with a dataset's ground truth (manifest.json).

Shared by tests/test_oracle.py and the Spark tests; returns a list of differences
(empty: the data agrees with what the broker delivered)."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

SAMPLES = Path(__file__).resolve().parent.parent / "sample_data"


def manifest(dataset: str) -> dict:
    return json.loads((SAMPLES / dataset / "manifest.json").read_text())


def datasets() -> list[str]:
    return sorted(p.name for p in SAMPLES.iterdir() if (p / "manifest.json").exists())


def _amqp10_expected(m: dict) -> dict:
    return {"properties": {k: v for k, v in m["properties"].items()},
            "application_properties": m["application_properties"],
            "message_annotations": {k: v for k, v in m["message_annotations"].items()
                                    if k not in ("x-exchange", "x-routing-key")}}


def _amqp10_actual(row: dict) -> dict:
    a = json.loads(row["annotations"])["amqp10"]
    props = {}
    for k, v in a["properties"].items():
        if v is None:
            props[k] = None
        elif k in ("to", "subject", "reply_to", "group_id", "reply_to_group_id"):
            props[k] = v["value"]
        elif k in ("content_type", "content_encoding"):
            props[k] = v["value"]
        elif k in ("absolute_expiry_time", "creation_time"):
            props[k] = v["value"] / 1000  # proton reports seconds
        elif k == "group_sequence":
            props[k] = v["value"]
        else:
            props[k] = v
    return {"properties": props, "application_properties": a["application_properties"],
            "message_annotations": a["message_annotations"]}


def compare(dataset: str, rows: list[dict]) -> list[str]:
    """``rows``: messages-table rows (dicts) of the dataset, in table order."""
    return compare_deliveries(manifest(dataset)["queues"], rows)


def compare_deliveries(queues: list[dict], rows: list[dict]) -> list[str]:
    """What a broker delivered (``queues``: records per queue, as in a manifest) against the
    messages-table ``rows`` predicted to survive a restart."""
    diffs = []
    got: dict[tuple, list] = {}
    for r in rows:
        if r["survives_restart"]:
            got.setdefault((r["vhost"], r["queue"]), []).append(r)
    expected = {(q["vhost"], q["name"]): q["messages"] for q in queues}
    for key in sorted(set(got) | {k for k, v in expected.items() if v}):
        exp, act = expected.get(key, []), got.get(key, [])
        if len(exp) != len(act):
            diffs.append(f"{key}: broker delivered {len(exp)}, predicted {len(act)}")
            continue
        for n, (e, a) in enumerate(zip(exp, act)):
            where = f"{key}[{n}]"
            if e["protocol"] == "amqp10":
                if e["body_section"] == "data":
                    if hashlib.sha256(a["body"] or b"").hexdigest() != e["body_sha256"]:
                        diffs.append(f"{where}: body differs")
                else:
                    ann = json.loads(a["annotations"])["amqp10"]
                    if ann.get("body_value") != e["body_value"]:
                        diffs.append(f"{where}: amqp-value {ann.get('body_value')} != {e['body_value']}")
                ea, aa = _amqp10_expected(e), _amqp10_actual(a)
                for part in ea:
                    if ea[part] != aa[part]:
                        diffs.append(f"{where}: {part}: {aa[part]} != {ea[part]}")
                continue
            if hashlib.sha256(a["body"] or b"").hexdigest() != e["body_sha256"]:
                diffs.append(f"{where}: body sha256 differs ({len(a['body'] or b'')} vs {e['body_len']} bytes)")
            if a["exchange"] != e["exchange"]:
                diffs.append(f"{where}: exchange {a['exchange']!r} != {e['exchange']!r}")
            if (a["routing_keys"] or [None])[0] != e["routing_key"]:
                diffs.append(f"{where}: routing key {a['routing_keys']} != {e['routing_key']!r}")
            props = dict(a["properties"])
            ts = props.pop("timestamp")
            props["timestamp"] = None if ts is None else int(ts.timestamp()) if hasattr(ts, "timestamp") else ts // 1_000_000
            if props != e["properties"]:
                delta = {k: (props.get(k), e["properties"].get(k)) for k in e["properties"]
                         if props.get(k) != e["properties"].get(k)}
                diffs.append(f"{where}: properties differ {delta}")
            headers = json.loads(a["headers"]) if a["headers"] else None
            if headers != e["headers"]:
                diffs.append(f"{where}: headers differ:\n  got  {headers}\n  want {e['headers']}")
    return diffs


__all__ = ["compare", "compare_deliveries", "datasets", "manifest", "SAMPLES", "base64"]
