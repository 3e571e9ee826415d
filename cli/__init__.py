"""The ``cqforensics`` command line (thin over the cqforensics library)."""
