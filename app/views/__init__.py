"""The read model behind the status pages and their live updates, apart from HTTP.

| Module | What |
|---|---|
| ``data.py`` | loading a queue's live batches, path sets, builds, probabilities and timing |
| ``forecast.py`` | pure: P(land) and ETA per request and batch |
| ``trail.py`` | pure: a request's stage trail and the typed reason it left the queue |
| ``stages.py`` | which stage a public status belongs to |
| ``events.py`` | ``EventHub``: the per-process request-log poller feeding live streams |
| ``schemas.py`` | the shapes of what the pages read (the API's response models) |

Who owns which table: the gateway owns the request log and its projections
(``app/gateway``); the orchestrator's controllers own batches, path sets, builds and
the rest. Views only read — both halves, through their repositories — and never write.
"""
