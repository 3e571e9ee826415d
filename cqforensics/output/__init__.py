"""Everything this tool writes goes through here: the one rule for output paths (``guard``),
and what produced an output (``provenance``)."""
