"""The read-only commands: fsck, audit, export and find, dump, republish, report."""
