"""The gateway's own writes, apart from HTTP: accepting a land (``landing.py``: the
claims, the idempotency key, the hidden receipt, the ``start`` hand-off).

The gateway is the only writer of the request log and its projections
(``request_log``, ``request_summaries``, ``change_uri_requests``, the change claims
and idempotency keys of acceptance); the orchestrator's controllers own every other
table. ``app/api`` calls in here and into ``app/views`` (reads), never the
repositories directly.
"""
