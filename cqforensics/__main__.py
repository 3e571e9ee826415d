"""``python -m cqforensics`` runs the command line."""

from cli.main import run

run()
