"""Conflict analyzers: which in-flight batches a new batch must wait for."""
