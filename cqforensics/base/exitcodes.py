"""e2fsck-style exit codes (bits): what the commands and the library's results return, and what
``CQError.exit_code`` carries. ``cli.exitcodes`` re-exports them."""

OK = 0  # no errors
FIXED = 1  # errors found and fixed (repair commands)
INCOMPLETE = 2  # fsck: the node holds queue storage not read (quorum queues, streams): the check is incomplete
ERRORS_LEFT = 4  # errors found and left
OPERATIONAL = 8  # the tool could not do its job (unreadable input, bug)
USAGE = 16  # bad command line
INTERRUPTED = 32  # interrupted (Ctrl-C)
