"""Outbound notification sinks (``docs/notifications.md``)."""
