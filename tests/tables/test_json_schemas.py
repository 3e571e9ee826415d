"""Every JSON document and line cqforensics writes follows the one convention (msg_id hex, nested
typed headers, body_base64, decimal offsets) and validates against its shipped JSON Schema
(cqforensics/json_schemas/*.json, draft 2020-12), on real outputs of every sample."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from support import FAST_DATASETS, SAMPLES, dataset_params
from support.cli import run


@pytest.fixture(scope="module")
def validators():
    from referencing import Registry, Resource

    from cqforensics import json_schemas as schemas

    loaded = {n: schemas.load(n) for n in schemas.names()}
    registry = Registry().with_resources([(s["$id"], Resource.from_contents(s)) for s in loaded.values()])
    out = {}
    for n, s in loaded.items():
        jsonschema.Draft202012Validator.check_schema(s)
        out[n] = jsonschema.Draft202012Validator(
            s, registry=registry, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
        )
    return out


def _valid(validators, name: str, doc) -> None:
    errors = sorted(validators[name].iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert not errors, f"{name}: {errors[0].message} at {list(errors[0].absolute_path)}"


def test_shipped_schemas_are_current_and_packaged():
    from cqforensics import json_schemas as schemas

    for name, s in schemas.generated().items():
        assert schemas.load(name) == json.loads(json.dumps(s)), (
            f"{name}.json is stale: python3 -m cqforensics.json_schemas"
        )
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"json_schemas/*.json"' in pyproject
    assert {"fsck", "finding", "audit", "dump-line", "export-line", "lost-found-line", "provenance"} <= set(
        schemas.names()
    )
    assert schemas.load("fsck")["properties"]["format"] == {"const": "cqforensics-fsck/1"}


def _lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _convention(row: dict) -> None:
    """The convention, beyond what a schema says: no raw body, ids hex, headers nested."""
    assert "body" not in row and "body_preview" not in row
    if row.get("msg_id") is not None:
        assert len(row["msg_id"]) == 32 and int(row["msg_id"], 16) >= 0
    for k in ("headers", "annotations", "details"):
        assert not isinstance(row.get(k), str), k


@pytest.mark.parametrize("dataset", dataset_params())
def test_every_output_of_every_sample_validates(dataset, validators, tmp_path, capsys):
    from cqforensics.base.schema import TABLES

    src = str(SAMPLES / dataset / "mnesia")
    # the form of the documents is checked: the commands fork their default workers (a worker per CPU)
    # on the fast tier's datasets, one per storage kind, and run in one process (-j 1) on the others;
    # forking cost 55% more CPU on 4.0.5-quorum-kill, and -j 1 is the path the workers' output equals
    ONE = () if dataset in FAST_DATASETS else ("-j", "1")
    code, out, err = run(capsys, "fsck", "--json", *ONE, src)
    assert code in (0, 4), err
    fsck = json.loads(out)
    _valid(validators, "fsck", fsck)
    for f in fsck["findings"]:
        _convention(f)
    code, out, _ = run(capsys, "fsck", "--jsonl", *ONE, src)
    for line in _lines(out):
        _valid(validators, "finding", line)
    code, out, _ = run(capsys, "audit", "--json", *ONE, src)
    assert code == 0
    _valid(validators, "audit", json.loads(out))
    for table in TABLES:
        code, out, err = run(capsys, "read", src, "--table", table, "--format", "jsonl", "--limit", "200", *ONE)
        assert code == 0, err
        for line in _lines(out):
            _valid(validators, f"read-{table}", line)
            _convention(line)
    code, out, err = run(capsys, "export", src, "--format", "jsonl", "--all", *ONE, "--out", str(tmp_path / "x"))
    assert code == 0, err
    rows = _lines((tmp_path / "x" / "messages.jsonl").read_text())
    assert rows
    for line in rows:
        _valid(validators, "export-line", line)
        _convention(line)
    # dump: the first file of every kind the sample holds
    from cqforensics.readers import registry

    seen = set()
    for p in sorted(Path(src).rglob("*")):
        if not p.is_file() or p.suffix not in registry.dumpable() and p.name not in registry.dumpable():
            continue
        kind = p.suffix or p.name
        if kind in seen:
            continue
        seen.add(kind)
        code, out, err = run(capsys, "dump", "--jsonl", "--deep", str(p))
        assert code == 0, err
        for line in _lines(out):
            _valid(validators, "dump-line", line)
            _convention(line)
    assert seen


def test_read_jsonl_and_export_spell_a_message_the_same_way(tmp_path, capsys):
    """One message, one spelling: the read line and the export line agree field by field."""
    src = str(SAMPLES / "4.3.6-kill" / "mnesia")
    code, out, _ = run(capsys, "read", src, "--format", "jsonl")
    read = {(r["vhost"], r["queue"], r["priority"], r["seq_id"]): r for r in _lines(out)}
    run(capsys, "export", src, "--format", "jsonl", "--out", str(tmp_path / "x"))
    exported = _lines((tmp_path / "x" / "messages.jsonl").read_text())
    assert exported and any(r["headers"] for r in exported)
    for e in exported:
        r = read[(e["vhost"], e["queue"], e["priority"], e["seq_id"])]
        assert {k: v for k, v in e.items() if k != "source"} == r


def test_provenance_of_reports_exports_and_lost_found(validators, tmp_path, capsys):
    import hashlib
    import shutil

    import pyarrow.parquet as pq

    from cqforensics import __version__
    from cqforensics import compiled as core
    from cqforensics.write import rebuild
    from support.scenarios import SCENARIOS

    src = SAMPLES / "4.3.6-kill" / "mnesia"
    files = sorted(str(p) for p in src.rglob("*") if p.is_file() and not p.is_symlink())

    def check(p: dict, command: str, as_of: str | None = "2030-01-02T03:04:05Z", inputs=files) -> None:
        _valid(validators, "provenance", p)
        assert p["tool"] == "cqforensics" and p["version"] == __version__ and p["core"] == core.status()
        assert p["command"] == command and p["broker_version"] == "4.3"
        if as_of:
            assert p["as_of"] == as_of
        assert [i["path"] for i in p["inputs"]] == inputs
        one = p["inputs"][0]
        data = Path(one["path"]).read_bytes()
        assert one["size"] == len(data) and one["sha256"] == hashlib.sha256(data).hexdigest()

    code, out, _ = run(capsys, "fsck", "--json", "--as-of", "2030-01-02T03:04:05Z", str(src))
    check(json.loads(out)["provenance"], "fsck")
    code, out, _ = run(capsys, "fsck", "--json", str(src))
    assert json.loads(out)["provenance"]["as_of"] is not None  # "now", recorded as the instant used
    for fmt in ("parquet", "jsonl"):
        code, _, err = run(
            capsys, "export", str(src), "--format", fmt, "--as-of", "2030-01-02T03:04:05Z", "--out", str(tmp_path / fmt)
        )
        assert code == 0, err
        if fmt == "parquet":
            meta = pq.read_schema(tmp_path / fmt / "messages.parquet").metadata
            check(json.loads(meta[b"cqforensics.provenance"]), "export")
        else:
            check(json.loads((tmp_path / fmt / "messages.jsonl.provenance.json").read_text()), "export")
    damaged = tmp_path / "damaged"
    shutil.copytree(src, damaged)
    SCENARIOS["qs_crc"](damaged / "rabbit@localhost")
    result = rebuild(damaged, tmp_path / "rebuilt")
    assert result.lost_found  # transient messages at least
    lf = tmp_path / "rebuilt" / "lost+found"
    check(
        json.loads((lf / "provenance.json").read_text()),
        "rebuild",
        as_of=None,
        inputs=sorted(str(p) for p in damaged.rglob("*") if p.is_file() and not p.is_symlink()),
    )
    for line in _lines((lf / "lost+found.jsonl").read_text()):
        _valid(validators, "lost-found-line", line)
        _convention(line)
