"""Committed changes -> the landing zone: its layout and checkpoint (``zone``), records waiting
for a flush and their segments (``segment_buffer``), flushes on a thread of their own
(``writer``). The column contract and the file layer are ``capture.landing.records`` and
``capture.store.storage``, shared with the lake."""
