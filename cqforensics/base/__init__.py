"""The base layer: error types and exit codes, every integer code as an enum (``enums``),
findings, the tables' Arrow schemas, the one JSON convention and the process pool. Imports nothing else of the project."""
