"""e2fsck-style exit codes (bits): ``cqforensics.base.exitcodes``, re-exported."""

from cqforensics.base.exitcodes import ERRORS_LEFT, FIXED, INCOMPLETE, INTERRUPTED, OK, OPERATIONAL, USAGE

__all__ = ["OK", "FIXED", "INCOMPLETE", "ERRORS_LEFT", "OPERATIONAL", "USAGE", "INTERRUPTED"]
