"""Checks of the next boot as a whole: the queues (or vhost, or node) it crashes or hangs on,
and whether it recovers the vhost dirty (rebuilding the indexes from the files)."""

from __future__ import annotations

from cqforensics.base.errors import plural
from cqforensics.base.findings import Finding
from cqforensics.model import recovery
from cqforensics.model.vhost import VhostScan


def boot_crash_findings(vs: VhostScan) -> tuple[list[Finding], dict[str | None, str]]:
    """``boot-crash`` findings, and per queue label what crashes: "queue" or "vhost" (a node
    whose boot hangs, ``vs.node.boot_hangs``, is the caller's to apply)."""
    out: list[Finding] = []
    crash: dict[str | None, str] = {}
    for label, causes in sorted(vs.crashing_queues.items(), key=lambda kv: str(kv[0])):
        first = causes[0]
        if vs.node.boot_hangs and all(c.code.startswith("v1-") for c in causes):
            out.append(
                Finding(
                    "boot-crash",
                    f"RabbitMQ {vs.model} hangs at boot: the store's startup walker "
                    f"crashes on this CQv1 index damage ({first.message}); nothing is delivered",
                    first.file,
                    first.offset,
                    queue=label,
                    details={"causes": len(causes)},
                )
            )
            continue
        out.append(
            Finding(
                "boot-crash",
                f"RabbitMQ {vs.model} crashes queue {label} when it recovers it "
                f"({len(causes)} index record(s) it has no clause for, first: {first.message})",
                first.file,
                first.offset,
                queue=label,
                details={"causes": len(causes)},
            )
        )
        crash[label] = "queue"
    crash_queues, crash_vhost = vs.clean_crashes
    for label in sorted(crash_queues, key=str):
        what = (
            f"crash the vhost when it reads a damaged message of {label}; the vhost restarts and, the "
            "clean-shutdown files being consumed, recovers dirty (the prediction)"
            if crash_vhost
            else f"crash queue {label} when it reads a damaged message of it (541 INTERNAL_ERROR to the consumer), "
            + (
                "again after each restart: what follows that message is lost"
                if label in recovery.lost_on_read(vs)
                else "once: the restarted queue recovers its index from the files and drops it (the prediction)"
            )
        )
        out.append(
            Finding(
                "boot-crash",
                f"clean shutdown state: RabbitMQ {vs.model} will trust it and {what}; "
                "remove clean.dot and recovery.dets from a copy to get the dirty recovery fsck predicts "
                "with --assume-dirty",
                None,
                queue=label,
            )
        )
        crash[label] = "vhost" if crash_vhost else "queue"
    if vs.start_crash is not None:
        _, why, file = vs.recovery_state
        then = (
            "it stays down (every queue of it is lost until the file is dealt with)"
            if vs.start_crash == "every"
            else "restarted (rabbitmqctl restart_vhost, or the next boot) it recovers dirty (the prediction)"
        )
        out.append(
            Finding(
                "boot-crash",
                f"RabbitMQ {vs.model} cannot start this vhost: {why}; {then}",
                str(file),
                details={"vhost_starts": vs.start_crash != "every"},
            )
        )
    return out + clean_state_findings(vs) + store_crash_findings(vs), crash


def store_crash_findings(vs: VhostScan) -> list[Finding]:
    """``store-crash``: what can crash the vhost's message store while a clean start serves it
    (model.recovery.store_crash), what follows, and that the queues' predictions are bounds."""
    crash = vs.store_crash
    if crash is None:
        return []
    what = {
        "read": "a read of a damaged message in its current file (queues {q})",
        "remove": "expired messages it does not record, which queues {q} drop without reading them",
        "gc": "its garbage collector meeting files its recorded state does not describe ({q})",
        "double-ack": "a second ack of a message another queue holds too, by queues {q} after their restart",
    }
    causes = "; ".join(what[k].format(q=", ".join(map(str, who))) for k, who in crash.triggers)
    restart = {
        "dirty": "its restart recovers the vhost dirty",
        "either": "its restart recovers the vhost clean or dirty, depending on whether a queue crashed before",
    }
    down = (
        f"; more than {recovery.versions_constant('vhost_restarts')[0]} such crashes within "
        f"{recovery.versions_constant('vhost_restarts')[1]} s leave the vhost down"
        if crash.may_stay_down
        else ""
    )
    if crash.queues_may_stop:
        down += (
            "; a crash while its queues are still starting can leave some recorded as stopped (404, until "
            "rabbitmqctl restart_vhost)"
        )
    return [
        Finding(
            "store-crash",
            f"RabbitMQ {vs.model} {'will' if crash.certain else 'can'} crash this vhost's "
            f"message store while it serves ({causes}); {restart[crash.restart]}{down}: each queue delivers "
            "between predicted_min and predicted_max",
            str(vs.vhost.stores["persistent"].path) if "persistent" in vs.vhost.stores else None,
            severity="error" if crash.certain else "warning",
            details={
                "triggers": {k: list(map(str, who)) for k, who in crash.triggers},
                "restart": crash.restart,
                "may_stay_down": crash.may_stay_down,
                "queues_may_stop": crash.queues_may_stop,
            },
        )
    ]


def clean_state_findings(vs: VhostScan) -> list[Finding]:
    """A clean start's recorded state that disagrees with the files it stands for (stale or
    damaged clean-shutdown files): ``recovery-terms-mismatch`` per queue whose recovery terms
    do not describe its index, ``store-index-mismatch`` when msg_store_index.ets, as
    ``ets:file2tab`` loads it, lacks messages the queues hold."""
    if vs.recovery != "clean":
        return []
    out = []
    restarts = recovery.clean_restarts(vs)
    for q in vs.all_queue_dirs:
        st = recovery.queue_starts(vs).get(q.dir_name)
        if st is None:
            continue
        where = {"queue": q.name, "priority": q.priority}
        details = {"persistent_count": st.count, "seq_ids": [st.low, st.end], "found": st.found, "outside": st.outside}
        terms = f"its recovery terms record {plural(st.count, 'message')} at seq ids {st.low} to {st.end - 1}"
        if st.kind == "restart":
            out.append(
                Finding(
                    "recovery-terms-mismatch",
                    f"{terms}, its index holds {st.found} there: RabbitMQ "
                    f"{vs.model} crashes queue {q.label} at init, and its supervisor restarts it, which "
                    "recovers its index from the files (stale or damaged recovery.dets)",
                    str(vs.vhost.recovery_dets),
                    severity="error",
                    **where,
                    details={**details, "restarts": True},
                )
            )
        elif st.outside:
            out.append(
                Finding(
                    "recovery-terms-mismatch",
                    f"{plural(st.outside, 'message')} of queue {q.label} lie outside the "
                    f"seq ids its recovery terms cover ({st.low} to {st.end - 1}): RabbitMQ {vs.model} "
                    "never reads them, and new publishes reuse their slots (recovery.dets older than "
                    "the index)",
                    str(vs.vhost.recovery_dets),
                    severity="error",
                    **where,
                    details=details,
                )
            )
    st = vs.vhost.stores.get("persistent")  # its files only: no store index built for a path
    lost = {label: why for label, why in restarts.items() if "read" in why or "expiry" in why}
    if st is not None and lost:
        out.append(
            Finding(
                "store-index-mismatch",
                f"msg_store_index.ets lacks messages that queues hold "
                f"({', '.join(sorted(map(str, lost)))}): RabbitMQ {vs.model} trusts it, crashes each of "
                "them on reading such a message (541 INTERNAL_ERROR), and their restart drops those "
                "messages",
                str(st.msg_store_index),
                severity="error",
                details={"queues": sorted(map(str, lost))},
            )
        )
    return out


def recovery_findings(vs: VhostScan) -> list[Finding]:
    """``unclean-shutdown`` when the next boot recovers the vhost dirty."""
    mode, why, file = vs.recovery_state
    if mode != "dirty":
        return []
    return [
        Finding(
            "unclean-shutdown", f"{why}: the next boot rebuilds the indexes from the files (dirty recovery)", str(file)
        )
    ]
