"""Dead-letter reconcilers (``reconcilers.py`` holds the state tables; which topic gets
which reconciler is the stage registry's ``reconciler``, built by
``pipeline.build_reconcilers``)."""

from app.controllers.dlq.reconcilers import Outcome, Reconciler, Undecodable

__all__ = ["Outcome", "Reconciler", "Undecodable"]
