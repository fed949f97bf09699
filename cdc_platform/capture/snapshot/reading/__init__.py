"""The reader side of a snapshot: what runs in the snapshot asset's process (docs/snapshots.md)."""
