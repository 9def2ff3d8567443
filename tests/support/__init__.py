"""Reusable test helpers (not tests): deterministic interleavings (``interleave``)."""
