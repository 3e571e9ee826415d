"""The broker harness's ports (no broker needed): a port ``free_port`` hands out is claimed for
the process until released, so two xdist workers (or a bench beside a test run) never give the
same port to two brokers (seen: a 4.0.5 boot failing with ``dist_port_already_used``, the
port chosen by another worker between its choice and its broker's boot)."""

from __future__ import annotations

import subprocess
import sys

from support import ROOT


def _claim_elsewhere(port: int) -> bool:
    """Whether another process may claim ``port`` now."""
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from brokers import harness; print(harness._claim({port}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


def test_a_port_handed_out_is_claimed_until_released():
    from brokers.harness import _claim, free_port, release

    port = free_port()
    try:
        assert not _claim(port), "handed out twice in one process"
        assert not _claim_elsewhere(port), "another process could claim a port handed out here"
    finally:
        release(port)
    assert _claim_elsewhere(port), "a released port stays claimed"


def test_every_port_of_a_process_is_different():
    from brokers.harness import free_port, release

    ports = [free_port() for _ in range(60)]
    try:
        assert len(set(ports)) == len(ports)
    finally:
        release(*ports)
