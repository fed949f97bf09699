"""Where the engine's files live: a ``FileStore`` on a local disk or on S3, and a lease on it.

``storage`` holds the store's interface and the local one, ``s3store`` the S3 one (conditional
writes, retries through outages), ``lease`` the single-writer lease object stores need instead
of a file lock.
"""
