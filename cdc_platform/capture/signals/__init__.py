"""Signals: how operators steer snapshots through a Kafka topic (the seeds' signal channel).

``messages`` parses and validates one signal message, ``plan`` decides what a batch of them
does (which tables to snapshot, which sessions to stop, pause or resume, what to skip and why),
``kafka`` reads and writes the signal and notification topics, ``notifications`` builds the
Debezium-style progress notifications. Pure Python: the Dagster sensor (``defs/signals``) only
wires these together.
"""
