"""Pluggable edges per merge queue: change providers, builds, merger, conflict analysis."""
