"""Dead-letter reconcilers (``reconcilers.py`` holds the state tables)."""

from app.controllers.dlq.reconcilers import Outcome, Reconciler, Undecodable, build_reconcilers

__all__ = ["Outcome", "Reconciler", "Undecodable", "build_reconcilers"]
