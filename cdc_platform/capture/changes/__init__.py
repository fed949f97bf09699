"""Events -> committed changes: the transaction buffer (``transactions``), records held or
spilled (``spill``), rows events as records (``row_images``), prepared XA transactions across
restarts (``xa_state``)."""
