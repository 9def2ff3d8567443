"""Pure speculation planning over snapshots: no I/O."""
