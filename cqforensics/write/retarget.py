"""Moving a node's messages to a broker of another release series.

The message stores are retargeted by ``formats`` (index versions, stored term shapes). The
metadata (Mnesia or Khepri), the feature flags and the recovery files cannot be: a broker of
another series refuses them or loses the queues, so a cross-series output takes its metadata from
a *template*, a node dir the target broker wrote itself, in which the queues were declared
(``definitions``: the source's vhosts, durable exchanges, classic queues and bindings as a
``rabbitmqctl import_definitions`` file). Why, from the RabbitMQ source
(``rabbitmq/rabbitmq-server``):

* Feature flags: at boot ``rabbit_prelaunch_feature_flags:setup`` initialises the registry from
  ``<node>-feature_flags``; a flag the target requires that the file does not list enabled makes
  it fail (``{disabled_required_feature_flag, F}`` -> ``failed_to_initialize_feature_flags_registry``).
  A 3.10.8 node booted by 4.0.5 fails so (tests/real_brokers/test_writers_retarget_brokers.py); RabbitMQ never
  supports a downgrade, and 3.x nodes upgrade one minor at a time (3.13 -> 4.0 for 4.x).
* Metadata store: 4.3 reads Khepri only (``khepri_db`` required); 3.10 - 3.12 know only Mnesia, so a
  4.3 node booted by 3.10 looks like a new node to it (no Mnesia schema).
* Queues: the vhost's classic queues recover from the durable queues the metadata lists
  (``rabbit_amqqueue:recover`` -> ``rabbit_variable_queue:start(VHost, DurableQueueNames)``), and
  ``rabbit_queue_index:start`` deletes every queue dir not among them, so a node with no (or
  foreign) metadata starts with its queues' dirs deleted and their messages unreferenced. The
  dirs are named by md5("queue" ++ vhost ++ name) (``queue_name_to_dir_name``), the same in every
  version, so declaring the same queue on the target makes its boot attach the written dir.

Within 4.x the broker migrates the metadata itself (a 4.0.5 Mnesia node boots on 4.3.6, which
moves it to Khepri), so no template is needed there.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cqforensics.base.errors import UsageError, queue_ref
from cqforensics.discovery import nodes as layout
from cqforensics.model.versions import BrokerModel
from cqforensics.write import formats
from cqforensics.write.output import copy_tree

#: exchanges every vhost has (declared by the broker; never imported)
_BUILTIN_PREFIX = b"amq."


def metadata_gap(source: BrokerModel, target: BrokerModel) -> str | None:
    """Why ``target`` cannot boot the metadata, feature flags and recovery files ``source``
    wrote (None: it can, as its own or by the upgrade the broker performs at boot)."""
    s, t = source.version[:2], target.version[:2]
    if s == t:
        return None
    if t < s:
        return (
            f"RabbitMQ {target} cannot boot the metadata of {source}: RabbitMQ supports no downgrade (its "
            "feature-flag file lists flags the older broker does not know"
            + ("; and 4.3 keeps its metadata in Khepri only" if s >= (4, 3) else "")
            + ")"
        )
    if s[0] == 4:
        return None  # 4.x upgrades between minors (4.0.5 -> 4.3.6 boots, Mnesia moved to Khepri)
    if (s[0] == t[0] and t[1] == s[1] + 1) or (s == (3, 13) and t == (4, 0)):
        return None  # the supported upgrade step (every stable feature flag of the source enabled)
    return (
        f"RabbitMQ {target} cannot boot the metadata of {source}: it requires feature flags {source} "
        "does not have (upgrades go one minor at a time, and to 4.x from 3.13 only)"
    )


# -- definitions ---------------------------------------------------------------------------------------


def _text(b) -> str:
    return bytes(b).decode("utf-8", "surrogateescape") if isinstance(b, (bytes, bytearray)) else str(b)


def _value(kind, value):
    """An AMQP table value as decoded by ``readers.metadata`` -> its JSON form in definitions."""
    kind = str(kind)
    if isinstance(value, (bytes, bytearray)):
        return _text(value)
    if kind == "table" and isinstance(value, list):
        return _table(value)
    if kind == "array" and isinstance(value, list):
        return [_value(k, v) for k, v in value] if all(isinstance(x, tuple) and len(x) == 2 for x in value) else value
    if kind == "bool":
        return bool(value) if not isinstance(value, str) else value == "true"
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def _table(items) -> dict:
    out = {}
    for item in items or ():
        if isinstance(item, tuple) and len(item) == 3:
            out[_text(item[0])] = _value(item[1], item[2])
    return out


def _written_versions(node: layout.NodeDir) -> dict[tuple[bytes, str], int]:
    """(vhost, queue name) -> the index version of the queue's dir in SRC."""
    out = {}
    for vh in node.vhosts:
        for q in vh.queues:
            if vh.name_raw is not None and q.name is not None and q.index_version is not None:
                out[(vh.name_raw, q.name)] = q.index_version
    return out


def definitions(src, target: BrokerModel) -> dict:
    """The definitions (``rabbitmqctl import_definitions`` format) that declare, on a fresh node
    of ``target``, what SRC's message stores need: its vhosts, durable exchanges (the built-in
    ``amq.*`` and default ones aside), durable classic queues with their arguments, and
    bindings. For 3.x targets each queue declares the ``x-queue-version`` its dir is written
    with (``formats.index_version``), so the queue opens the index it finds; on 4.x the
    argument is dropped (v2 only). Users, permissions and policies are not part of it."""
    from cqforensics.readers.metadata import read_metadata

    nodes = layout.discover([Path(src)])
    if len(nodes) != 1:
        raise UsageError(f"{src}: definitions are made for one node dir; found {len(nodes)}")
    node = nodes[0]
    meta = read_metadata(node.path)
    if meta.kind is None:
        raise UsageError(f"{node.path}: no readable metadata (Mnesia or Khepri) to take the queues from")
    versions = _written_versions(node)
    vhosts = sorted(meta.vhosts | {v for v, _ in meta.queues})
    queues = []
    for (vh, name), q in sorted(meta.queues.items()):
        if not q.classic:
            continue
        args = _table(q.arguments)
        args.pop("x-queue-version", None)
        if not target.index_v2_only:
            declared = meta.arguments(vh, name).get("x-queue-version")
            current = versions.get((vh, _text(name)))
            args["x-queue-version"] = (
                formats.index_version(target, current=current)
                if current is not None
                else formats.index_version(target, declared if isinstance(declared, int) else None)
            )
        queues.append(
            {"name": _text(name), "vhost": _text(vh), "durable": True, "auto_delete": False, "arguments": args}
        )
    exchanges = [
        {
            "name": _text(name),
            "vhost": _text(vh),
            "type": kind,
            "durable": True,
            "auto_delete": False,
            "internal": False,
            "arguments": _table(meta.exchange_args.get((vh, name))),
        }
        for (vh, name), kind in sorted(meta.exchanges.items())
        if name and not name.startswith(_BUILTIN_PREFIX)
    ]
    bindings = [
        {
            "source": _text(b.source),
            "vhost": _text(b.vhost),
            "destination": _text(b.destination),
            "destination_type": b.dest_kind,
            "routing_key": _text(b.key),
            "arguments": _table(b.args),
        }
        for b in meta.bindings
        if b.source
    ]  # the default exchange's bindings are implicit
    return {
        "vhosts": [{"name": _text(v)} for v in vhosts],
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    }


def write_definitions(src, target: BrokerModel, path) -> dict:
    """``definitions`` written as JSON to ``path``, a new file and an output like any other
    (``cqforensics.output.guard``: never inside SRC or RabbitMQ data); returns them."""
    from cqforensics.output.guard import check_output, staged_file

    path = check_output(path, [src])
    defs = definitions(src, target)
    with staged_file(path, "w", command="definitions", inputs=[src]) as f:
        json.dump(defs, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return defs


# -- templates -----------------------------------------------------------------------------------------


def template_node(template) -> Path:
    """The node dir a template path names (a node dir, or a mnesia base holding exactly one)."""
    nodes = layout.discover([Path(template)])
    if len(nodes) != 1:
        raise UsageError(f"{template}: a template is one node dir of the target broker; found {len(nodes)}")
    return nodes[0].path


def install_template(template, src: Path, staging: Path, nodes: list) -> list[str]:
    """Put the template's metadata where ``rewrite`` would copy SRC's: everything of the
    template's node dir but its message stores (written anew) into the output node dir, and,
    when the output is a mnesia base, the template's ``<node>-feature_flags`` beside it.
    Returns notes."""
    tnode = template_node(template)
    if len(nodes) != 1:
        raise UsageError(f"{src}: --template applies to one node; SRC holds {len(nodes)}")
    out_node = staging / nodes[0].path.relative_to(src)
    out_node.mkdir(parents=True, exist_ok=True)
    copy_tree(tnode, out_node, {tnode / "msg_stores" / "vhosts"})
    notes = [f"metadata, feature flags and other files taken from the template {tnode}, not from SRC"]
    flags = tnode.parent / f"{tnode.name}-feature_flags"
    if out_node != staging:
        if flags.is_file():
            shutil.copy2(flags, out_node.parent / f"{out_node.name}-feature_flags")
        if tnode.name != out_node.name:
            notes.append(
                f"the template is node {tnode.name}, the output node dir is {out_node.name}: rename it "
                f"to {tnode.name} before booting (Mnesia and Khepri record the node name)"
            )
    return notes


def check_written(template, result, target: BrokerModel) -> list[str]:
    """Refuse (UsageError, before the output is committed) when a queue dir written is not a
    durable classic queue of the template's metadata (its boot would delete the dir), or, for
    3.x targets, when the template declares another index version than the dir is written with."""
    from cqforensics.readers.metadata import read_metadata

    meta = read_metadata(template_node(template))
    if meta.kind is None:
        raise UsageError(f"{template}: the template has no readable metadata (Mnesia or Khepri)")
    missing, mismatched = set(), set()
    for q in result.queues:
        if q.skipped or q.queue is None or q.vhost is None:
            continue
        key = (
            q.vhost.encode("utf-8", "surrogateescape") if isinstance(q.vhost, str) else q.vhost,
            q.queue.encode("utf-8", "surrogateescape"),
        )
        if key not in meta.queues:
            missing.add((q.vhost, q.queue))
            continue
        if not target.index_v2_only and q.written_version is not None:
            declared = meta.arguments(*key).get("x-queue-version")
            declared = declared if isinstance(declared, int) else target.default_index_version
            if declared != q.written_version:
                mismatched.add((q.vhost, q.queue, declared, q.written_version))
    if missing or mismatched:
        parts = []
        if missing:
            parts.append(
                "queues the template does not declare (its boot would delete their dirs): "
                + ", ".join(queue_ref(v, n) for v, n in sorted(missing))
            )
        if mismatched:
            parts.append(
                "queues the template declares with another x-queue-version than written: "
                + ", ".join(f"{queue_ref(v, n)} (declared v{d}, written v{w})" for v, n, d, w in sorted(mismatched))
            )
        raise UsageError(
            f"{template}: " + "; ".join(parts) + ". Declare them on the target node first: "
            "`cqforensics definitions --broker-version V SRC > defs.json`, then "
            "`rabbitmqctl import_definitions defs.json` on the node, and stop it"
        )
    return []


def carried_metadata_note(source: BrokerModel, target: BrokerModel) -> str | None:
    """The note a writer gives when it copies SRC's metadata for a target that cannot boot it."""
    gap = metadata_gap(source, target)
    if gap is None:
        return None
    return (
        f"the metadata, feature flags and recovery files were copied from SRC as they are: {gap}. "
        "To boot the output, write it with --template (a node dir of the target broker in which the "
        "queues were declared; see docs/commands.md, 'Moving to another release series')"
    )


__all__ = [
    "carried_metadata_note",
    "check_written",
    "definitions",
    "install_template",
    "metadata_gap",
    "template_node",
    "write_definitions",
]
