"""One reader per file kind: bytes + path in, decoded records (numpy arrays or small
dataclasses) and findings out. Readers never raise on damaged data: damage becomes a
``Finding`` with file and offset. Only I/O failures raise (OperationalError)."""
