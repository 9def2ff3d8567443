"""Scorers: how likely a batch is to land, for speculation."""
