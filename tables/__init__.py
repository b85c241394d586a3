"""State of the worker over Faust tables: raw partitions, buffered core stores, outboxes."""
