"""GitHub: the ``github`` change provider, its client, and a fake GitHub (docs/github.md)."""
