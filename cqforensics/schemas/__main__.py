"""``python3 -m cqforensics.schemas``: rewrite the generated schemas from the Arrow schemas."""

from cqforensics.schemas import write

for p in write():
    print(p)
