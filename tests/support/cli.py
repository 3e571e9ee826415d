"""Running the command line in-process, and a fingerprint of a tree (the read-only proof)."""

from __future__ import annotations

import hashlib
import os

from cli.main import main


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def fingerprint(root) -> dict:
    """Every file's bytes and mtime, and every dir's listing, under root."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        out[dirpath] = sorted(dirnames + filenames)
        for n in filenames:
            p = os.path.join(dirpath, n)
            st = os.stat(p)
            with open(p, "rb") as f:
                out[p] = (hashlib.sha256(f.read()).hexdigest(), st.st_mtime_ns, st.st_size)
    return out
