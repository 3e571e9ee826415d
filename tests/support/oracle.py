"""Compare the readers' prediction with a dataset's ground truth (manifest.json).

Shared by tests/model/test_oracle.py and the Spark tests; returns a list of differences
(empty: the data agrees with what the broker delivered)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
from pathlib import Path

SAMPLES = Path(__file__).resolve().parents[2] / "sample_data"


def archived(dataset: str) -> bool:
    """Whether the dataset is committed as its broker's node-dir archive (``<ds>/*.tar.gz``, the
    imported versions) rather than unpacked; ``extract_archives`` unpacks it into ``<ds>/mnesia/``."""
    return any((SAMPLES / dataset).glob("*.tar.gz"))


def extract_archives() -> list[Path]:
    """Unpack every archived dataset into ``<ds>/mnesia/`` (gitignored) unless already done, so
    that ``SAMPLES / dataset / "mnesia"`` works for every dataset. Idempotent and safe to run
    concurrently: each archive is unpacked into a temp dir renamed into place; a stamp file
    (``<ds>/.mnesia.extracted``, the archive's sha256) says which archive the dir came from."""
    import shutil
    import tarfile
    import tempfile

    done = []
    for tarball in sorted(SAMPLES.glob("*/*.tar.gz")):
        ds = tarball.parent
        digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
        stamp, dest = ds / ".mnesia.extracted", ds / "mnesia"
        if dest.is_dir() and stamp.exists() and stamp.read_text().strip() == digest:
            continue
        tmp = Path(tempfile.mkdtemp(prefix=".mnesia-", dir=ds))
        tmp.chmod(0o755)
        with tarfile.open(tarball) as tf:
            tf.extractall(tmp, filter="data")
        if dest.exists():
            shutil.rmtree(dest)
        try:
            tmp.rename(dest)
        except OSError:  # another process put it there first
            shutil.rmtree(tmp, ignore_errors=True)
        stamp.write_text(digest + "\n")
        done.append(dest)
    return done


def manifest_path(dataset: str) -> Path | None:
    """``manifest.json``, or ``manifest.json.gz`` (the large manifests of imported datasets)."""
    for name in ("manifest.json", "manifest.json.gz"):
        if (SAMPLES / dataset / name).exists():
            return SAMPLES / dataset / name
    return None


def manifest(dataset: str) -> dict:
    path = manifest_path(dataset)
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)


def datasets() -> list[str]:
    return sorted(p.name for p in SAMPLES.iterdir() if p.is_dir() and manifest_path(p.name) is not None)


def delivered_counts(m: dict) -> dict:
    """(vhost, queue) -> what the broker delivered after the restart: each queue's drained
    messages, and each stream's records served from ``first`` over the stream protocol."""
    out = {(q["vhost"], q["name"]): len(q["messages"]) for q in m["queues"] if q.get("exists_after_restart", True)}
    for t in m.get("streams", []):
        out[(t["vhost"], t["stream"])] = len(t["served_stream_protocol"]["records"])
    return out


def _amqp10_expected(m: dict) -> dict:
    return {
        "properties": {k: v for k, v in m["properties"].items()},
        "application_properties": m["application_properties"],
        "message_annotations": {
            k: v for k, v in m["message_annotations"].items() if k not in ("x-exchange", "x-routing-key")
        },
    }


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
    return {
        "properties": props,
        "application_properties": a["application_properties"],
        "message_annotations": a["message_annotations"],
    }


def compare(dataset: str, rows: list[dict]) -> list[str]:
    """``rows``: messages-table rows (dicts) of the dataset, in table order."""
    m = manifest(dataset)
    return compare_deliveries(m["queues"], rows, m.get("properties_recorded"))


def compare_deliveries(queues: list[dict], rows: list[dict], recorded: list[str] | None = None) -> list[str]:
    """What a broker delivered (``queues``: records per queue, as in a manifest) against the
    messages-table ``rows`` predicted to survive a restart. ``recorded``: the basic properties
    the truth recorded when it holds fewer than all 13 (imported datasets); only those, and
    every one of them, are compared."""
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
            props["timestamp"] = (
                None if ts is None else int(ts.timestamp()) if hasattr(ts, "timestamp") else ts // 1_000_000
            )
            if recorded is not None:
                props = {k: props[k] for k in recorded}
            if props != e["properties"]:
                delta = {
                    k: (props.get(k), e["properties"].get(k))
                    for k in e["properties"]
                    if props.get(k) != e["properties"].get(k)
                }
                diffs.append(f"{where}: properties differ {delta}")
            headers = json.loads(a["headers"]) if a["headers"] else None
            if a.get("location") == "dead_letter_replay" and headers and e["headers"]:
                headers = _boot_time(headers, e["headers"])
            if headers != e["headers"]:
                diffs.append(f"{where}: headers differ:\n  got  {headers}\n  want {e['headers']}")
    return diffs


def _boot_time(got: dict, want: dict, slack: int = 10) -> dict:
    """A message a quorum queue dead-letters again at the boot carries the boot's clock in its
    x-death ``time``, which the prediction can only place at ``as_of``: within ``slack``
    seconds of the broker's it counts as the broker's."""
    try:
        g = got["x-death"]["value"][0]["value"]["time"]
        w = want["x-death"]["value"][0]["value"]["time"]
    except (KeyError, IndexError, TypeError):
        return got
    if abs(g["value"] - w["value"]) <= slack:
        got = json.loads(json.dumps(got))
        got["x-death"]["value"][0]["value"]["time"] = w
    return got


__all__ = [
    "archived",
    "compare",
    "compare_deliveries",
    "datasets",
    "delivered_counts",
    "extract_archives",
    "manifest",
    "SAMPLES",
    "base64",
]
