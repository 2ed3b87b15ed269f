"""The experience buffer on the shared filesystem.

``experience`` (one record, its JSON line), ``segment_file`` (one sealed segment, the folder
layout), ``segments`` (the writer, the reader with a resumable cursor), ``sqlite`` (the
single-node SQLite transport and the archive).
"""
