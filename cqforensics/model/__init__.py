"""The broker as this project understands it: options, version behaviour, queue indexes as
typed columns, shared-store indexes, the one recovery model (what the next boot does to every
entry) and node/vhost scans that hand out body bytes through one accessor.

Layers (checked by import-linter, see pyproject.toml): ``model`` imports readers, codecs and the
base modules; checks, tables, the commands and the writers import ``model``; nothing below
imports it.
"""
