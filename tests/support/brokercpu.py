"""What the real brokers cost a test run: ``python tests/support/brokercpu.py LOG`` sums the
lines ``brokers.harness`` appends to ``CQF_BROKER_CPU_LOG`` (one per broker run) by test module
and by version: runs, boot CPU, whole-run CPU."""

from __future__ import annotations

import collections
import sys


def main(path: str) -> None:
    runs = collections.Counter()
    boot = collections.Counter()
    total = collections.Counter()
    for line in open(path):
        version, _, _, boot_cpu, run_cpu, test = line.rstrip("\n").split("\t")
        for key in (test.split("::")[0], f"RabbitMQ {version}", "all"):
            runs[key] += 1
            boot[key] += float(boot_cpu)
            total[key] += float(run_cpu)
    print(f"{'broker runs':>11} {'boot CPU s':>10} {'run CPU s':>10}  of")
    for key, cpu in total.most_common():
        print(f"{runs[key]:11d} {boot[key]:10.0f} {cpu:10.0f}  {key}")


if __name__ == "__main__":
    main(sys.argv[1])
