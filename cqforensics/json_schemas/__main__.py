"""``python3 -m cqforensics.json_schemas``: rewrite the generated schemas from the Arrow schemas."""

from cqforensics.json_schemas import write

for p in write():
    print(p)
