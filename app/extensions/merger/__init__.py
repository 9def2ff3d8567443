"""Mergers: dry-run and apply the changes of a batch onto the target."""
