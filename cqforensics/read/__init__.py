"""The one read path (``driver``) and the embedded Python API (``api``)."""
