"""Declarative construct grammars of every on-disk format, one module per format.

Grammars only: no I/O, no logic. Each field cites the RabbitMQ source that writes or reads it
(abbreviations as in docs/formats/classic.md, e.g. IDX2 = rabbit_classic_queue_index_v2.erl).
Fixed-size records also export a numpy dtype or struct twin used on the hot path; tests prove
the twin decodes every sample record exactly like the grammar.

Call sites import a module as a namespace: ``from cqforensics.grammar import qi as c_qi``.
"""
