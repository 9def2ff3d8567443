"""Change providers: what a change touches and who wrote it."""
