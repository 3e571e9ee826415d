"""The data tables as Arrow record batches, built from a ``VhostScan``."""
