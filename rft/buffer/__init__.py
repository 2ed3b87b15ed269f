"""The experience buffer on the shared filesystem.

``experience`` (one record, its JSON line), ``segments`` (sealed JSONL segments: writer,
reader with a resumable cursor), ``sqlite`` (the single-node SQLite transport and the archive).
"""
