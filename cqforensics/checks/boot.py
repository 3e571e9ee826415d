"""Checks of the next boot as a whole: the queues (or vhost, or node) it crashes or hangs on,
and whether it recovers the vhost dirty (rebuilding the indexes from the files)."""

from __future__ import annotations

from cqforensics.findings import Finding
from cqforensics.model.vhost import VhostScan


def boot_crash_findings(vs: VhostScan) -> tuple[list[Finding], dict[str | None, str]]:
    """``boot-crash`` findings, and per queue label what crashes: "queue" or "vhost" (a node
    whose boot hangs, ``vs.node.boot_hangs``, is the caller's to apply)."""
    out: list[Finding] = []
    crash: dict[str | None, str] = {}
    for label, causes in sorted(vs.crashing_queues.items(), key=lambda kv: str(kv[0])):
        first = causes[0]
        if vs.node.boot_hangs and all(c.code.startswith("v1-") for c in causes):
            out.append(Finding("boot-crash", f"RabbitMQ {vs.model} hangs at boot: the store's startup walker "
                               f"crashes on this CQv1 index damage ({first.message}); nothing is delivered",
                               first.file, first.offset, queue=label, details={"causes": len(causes)}))
            continue
        out.append(Finding("boot-crash", f"RabbitMQ {vs.model} crashes queue {label} when it recovers it "
                           f"({len(causes)} index record(s) it has no clause for, first: {first.message})",
                           first.file, first.offset, queue=label, details={"causes": len(causes)}))
        crash[label] = "queue"
    crash_queues, crash_vhost = vs.clean_crashes
    for label in sorted(crash_queues, key=str):
        out.append(Finding("boot-crash", f"clean shutdown state: RabbitMQ {vs.model} will trust it and crash "
                           f"{'the vhost' if crash_vhost else 'queue ' + str(label)} when it reads a damaged "
                           f"message of {label}; remove clean.dot and recovery.dets from a copy to get the "
                           "dirty recovery fsck predicts with --assume-dirty", None, queue=label))
        crash[label] = "vhost" if crash_vhost else "queue"
    return out, crash


def recovery_findings(vs: VhostScan) -> list[Finding]:
    """``unclean-shutdown`` when the next boot recovers the vhost dirty."""
    if vs.recovery != "dirty":
        return []
    st = vs.vhost.stores.get("persistent")
    why = "no clean.dot" if st is None or not st.clean_dot.exists() else \
        "clean-shutdown files do not match the queues' recovery terms"
    return [Finding("unclean-shutdown", f"{why}: the next boot rebuilds the indexes from the files "
                    "(dirty recovery)", str(vs.vhost.path))]
