"""SubmitQueue: a speculative merge queue."""

__version__ = "0.1.0"
