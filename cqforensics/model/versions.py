"""What each RabbitMQ version does with the files at boot, and which version wrote the data.

Only behaviour that changes what the next boot delivers is modelled (rabbitmq-formats.md
section 8 and the sources cited there):

==============  =====================  ==================  =================================
version         shared-store scan      duplicate in file   CQv1 index
==============  =====================  ==================  =================================
3.10 - 3.12     sequential; stops at   last copy wins      read
                a zero size field      (reverse fold)
3.13.0          sequential             first copy wins     read
3.13.1 - 3.13   byte-wise resync       first copy wins     read
4.0 - 4.2       byte-wise + index      first copy wins     converted to v2 at boot
4.3             byte-wise + index      first copy wins     not read (ignored; clean v1 terms crash)
==============  =====================  ==================  =================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cqforensics.errors import UsageError

_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?$")


@dataclass(frozen=True)
class BrokerModel:
    version: tuple[int, int, int]
    label: str

    @property
    def sequential_scan(self) -> bool:
        """<= 3.13.0: rabbit_msg_file:scan stops at a zero size field (MF@v3.12.0 scanner)."""
        return self.version <= (3, 13, 0)

    @property
    def last_copy_wins(self) -> bool:
        """<= 3.12: candidates are claimed in reverse file order (build_index_worker foldl)."""
        return self.version < (3, 13, 0)

    @property
    def reads_v1(self) -> bool:
        return self.version < (4, 3, 0)

    @property
    def converts_v1(self) -> bool:
        return (4, 0, 0) <= self.version < (4, 3, 0)

    @property
    def large_message_own_file(self) -> bool:
        return self.version >= (4, 0, 0)

    @property
    def stores_mc(self) -> bool:
        """>= 3.13.0: messages are stored as ``#mc{}`` containers, not ``#basic_message{}``."""
        return self.version >= (3, 13, 0)

    @property
    def utf8_atoms(self) -> bool:
        """>= 4.0 (OTP 26+): atoms are written as SMALL_ATOM_UTF8_EXT."""
        return self.version >= (4, 0, 0)

    @property
    def index_v2_only(self) -> bool:
        """>= 4.0: every classic queue uses the v2 index (x-queue-version is ignored; v1 dirs
        are converted at boot), so writers write v2."""
        return self.version >= (4, 0, 0)

    @property
    def shared_read_crash_takes_vhost(self) -> bool:
        """<= 3.12: a failed shared-store read crashes the vhost's message store, taking every
        queue of the vhost down (seen on 3.10.8); later versions crash the reading queue."""
        return self.version < (3, 13, 0)

    @property
    def missing_qs_reads_empty(self) -> bool:
        """>= 4.0: a clean start reads a missing ``.qs`` segment as holding no messages
        instead of crashing the queue on the read."""
        return self.version >= (4, 0, 0)

    def __str__(self) -> str:
        return self.label


SUPPORTED = ("3.10", "3.11", "3.12", "3.13.0", "3.13.1", "3.13", "4.0", "4.1", "4.2", "4.3")


def model(version: str) -> BrokerModel:
    """'3.10', '3.13.1', '4.3', '4.0.5' ... -> BrokerModel (3.10 <= version <= 4.3)."""
    m = _VERSION.match(version.strip())
    if not m:
        raise UsageError(f"bad broker version {version!r}; use e.g. 3.10, 3.13.1, 4.0 or 4.3.6")
    major, minor = int(m.group(1)), int(m.group(2))
    patch = int(m.group(3)) if m.group(3) is not None else (7 if (major, minor) == (3, 13) else 0)
    v = (major, minor, patch)
    if not (3, 10, 0) <= v < (4, 4, 0):
        raise UsageError(f"broker version {version} is outside the supported range 3.10 .. 4.3")
    return BrokerModel(v, version.strip())


@dataclass
class Evidence:
    """Facts about the data that narrow down which version wrote it."""

    basic_message: bool = False  # <= 3.12 term shape
    mc: bool = False  # >= 3.13 term shape
    latin1_atoms: bool = False  # ATOM_EXT: OTP <= 25
    utf8_atoms: bool = False  # SMALL_ATOM_UTF8: OTP >= 26
    khepri: bool = False  # 4.2+ default metadata store
    redeliver_seq_id: bool = False  # recovery terms of 4.3+
    next_deliver_seq_id: bool = False  # recovery terms <= 4.2
    index_module: bool = False  # clean.dot of <= 3.13
    v1_files: bool = False

    def infer(self) -> tuple[BrokerModel, str]:
        """The most likely version, and why."""
        if self.redeliver_seq_id:
            return model("4.3"), "recovery terms carry redeliver_seq_id (4.3+)"
        if self.khepri and not self.v1_files:
            return model("4.3"), "metadata store is Khepri (default from 4.2)"
        if self.basic_message and not self.mc:
            return model("3.10"), "stored messages are #basic_message (3.10-3.12)"
        if self.mc and (self.latin1_atoms or self.index_module):
            return model("3.13"), "#mc messages with OTP-25 atoms or an index_module in clean.dot (3.13)"
        if self.mc:
            return model("4.0"), "#mc messages with UTF-8 atoms (4.0-4.2)"
        if self.index_module or self.latin1_atoms:
            return model("3.10"), "clean.dot index_module / OTP-25 atoms (3.x)"
        if self.utf8_atoms or self.next_deliver_seq_id:
            return model("4.0"), "OTP-26+ atoms (4.x)"
        return model("4.3"), "no version evidence in the data; assuming the newest supported"


def term_evidence(raw, ev: Evidence) -> None:
    """Look at the first bytes of a stored term: its record tag and atom encoding."""
    if len(raw) < 4 or raw[0] != 131 or raw[1] != 104:
        return
    tag, rest = raw[3], bytes(raw[4:24])
    if tag == 100:
        ev.latin1_atoms = True
        name = rest[2:2 + int.from_bytes(rest[:2], "big")]
    elif tag in (119, 115):
        ev.utf8_atoms = ev.utf8_atoms or tag == 119
        ev.latin1_atoms = ev.latin1_atoms or tag == 115
        name = rest[1:1 + rest[0]]
    else:
        return
    if name == b"basic_message":
        ev.basic_message = True
    elif name == b"mc":
        ev.mc = True
