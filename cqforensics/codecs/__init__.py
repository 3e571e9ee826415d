"""Codecs: Erlang terms (ETF), AMQP 0-9-1 properties and tables, AMQP 1.0 sections, the small
text files a broker writes. Bytes in, values out; no file I/O."""
