"""Read-only incremental snapshots (ARCHITECTURE section 4): watermarks, chunks, commit rule.

``watermark`` reads a chunk between read-only GTID watermarks, ``chunks`` builds and reads
keyset chunks, ``commit_rule`` decides when the engine may commit a chunk and what it emits.
"""
