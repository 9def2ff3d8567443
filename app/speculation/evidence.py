"""Refine success probabilities with what the queue's own builds already showed (pure).

The scorer guesses P(batch lands) before anything is built. Finished path builds are
evidence about the batches they contained (the head and every dependency assumed to
``succeed``):

- a **passed** build vouches for every batch in it: each gets at least ``passed_p``;
- a **failed** build says at least one batch in it is bad (also while its path is
  being built again under ``speculation.retries``: until the retry passes, the failure
  is the evidence there is, so dependents' paths that assume the head fails get funded
  instead of waiting on the retry). Batches already vouched for
  or landed are cleared, and a build containing a batch that will not land (rejected or
  cancelled) says nothing about the others: that batch explains it (in a queue where
  every change conflicts, the builds of the changes behind a rejected one failed with
  it, and taking them for evidence against those changes hedged on them for nothing);
  if one *suspect* remains it gets at most ``failed_p``; with
  several, each suspect's probability is updated by Bayes' rule, given that at least
  one of them is bad: ``p' = p (1 - q) / (1 - p q)`` where ``q`` is the probability that
  all the other suspects are good. A suspect already known to be bad "explains away"
  the failure for the others (``q`` near 0 leaves ``p`` unchanged).

Several failed builds combine as independent observations (the likelihood ratios
multiply); the other suspects' probabilities come from the previous round, for a
fixed number of rounds. A flaky build makes this evidence wrong, which is why the
bounds are ``passed_p``/``failed_p`` and not 1/0: this only steers which paths get
built first, never what may land.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from app.domain.entities import PathEntry
from app.domain.states import PathStatus
from app.speculation.core import Resolution
from app.speculation.generator import DEFAULT_PROBABILITY, sanitize


@dataclass(frozen=True, slots=True)
class EvidencePolicy:
    passed_p: float = 0.99
    failed_p: float = 0.02
    rounds: int = 3

    def __post_init__(self) -> None:
        for name in ("passed_p", "failed_p"):
            v = getattr(self, name)
            if math.isnan(v) or not 0.0 < v < 1.0:
                raise ValueError(f"{name} must be strictly between 0 and 1, got {v}")
        if self.failed_p >= self.passed_p:
            raise ValueError("failed_p must be below passed_p")
        if self.rounds < 1:
            raise ValueError(f"rounds must be at least 1, got {self.rounds}")


def refine(probs: Mapping[str, float], entries: Mapping[str, Sequence[PathEntry]],
           res: Mapping[str, Resolution], policy: EvidencePolicy | None = None,
           ) -> dict[str, float]:
    """``probs`` (sanitized) updated with the evidence of every finished path build in
    ``entries``. Batches with no evidence keep their probability; batches that only
    appear in evidence get the generator's default as prior."""
    policy = policy or EvidencePolicy()
    good, failures = _evidence(entries, res)
    prior = {b: sanitize(p) for b, p in probs.items()}
    for s in failures:
        for b in s:
            prior.setdefault(b, DEFAULT_PROBABILITY)
    for b in good:
        prior[b] = max(prior.get(b, DEFAULT_PROBABILITY), policy.passed_p)
    if not failures:
        return prior
    return _explain_failures(prior, failures, policy)


def _evidence(entries: Mapping[str, Sequence[PathEntry]], res: Mapping[str, Resolution],
              ) -> tuple[set[str], list[tuple[str, ...]]]:
    """The batches vouched for (landed, or in a passed build) and, per failed build, its
    suspects: the batches in it that nothing vouched for."""
    finished = [e for es in entries.values() for e in es]
    good: set[str] = {b for b, r in res.items() if r is Resolution.SUCCEEDED}
    for e in finished:
        if e.status is PathStatus.PASSED:
            good.add(e.path.head)
            good.update(e.path.sides[0])
    failures: list[tuple[str, ...]] = []
    for e in finished:
        if e.status is PathStatus.FAILED or (e.status.live and e.retried > 0):
            if any(res.get(b) is Resolution.FAILED for b in e.path.sides[0]):
                continue  # explained away by a batch in it that will not land
            suspects = tuple(dict.fromkeys(
                b for b in (e.path.head, *e.path.base) if b not in good))
            if suspects:
                failures.append(suspects)
    return good, failures


def _explain_failures(prior: dict[str, float], failures: Sequence[tuple[str, ...]],
                      policy: EvidencePolicy) -> dict[str, float]:
    """``policy.rounds`` rounds of Bayes' rule over the failed builds' suspects."""
    current = dict(prior)
    for _ in range(policy.rounds):
        ratio: dict[str, float] = {}
        for s in failures:
            for b in s:
                # likelihood ratio P(fail | b good) / P(fail | b bad) = (1 - q) / 1
                q = math.prod(current[o] for o in s if o != b)
                ratio[b] = ratio.get(b, 1.0) * (1.0 - q)
        nxt = dict(prior)
        for b, r in ratio.items():
            p = prior[b]
            odds = p / (1.0 - p) * r
            nxt[b] = min(max(odds / (1.0 + odds), policy.failed_p), prior[b])
        current = nxt
    return current


def hedge_weights(probs: Mapping[str, float], known_in: Mapping[str, float],
                  policy: EvidencePolicy | None = None) -> dict[str, float]:
    """Probabilities for *funding*, discounted by how soon a batch's own build will tell.

    Hedging on a dependency's less likely outcome pays only for the time until its own
    running build reports: if it ends in a fraction ``u`` of a build time, a hedge built
    now saves at most ``u`` of a build time over building the right path once the
    result is in. The less likely side is therefore scaled by ``u`` (in ``[0, 1]``,
    from ``known_in``; batches absent from it keep their probability), and so is a
    batch whose evidence is already conclusive left alone.
    """
    policy = policy or EvidencePolicy()
    out = dict(probs)
    for b, u in known_in.items():
        p = out.get(b)
        if p is None or p >= policy.passed_p or p <= policy.failed_p:
            continue
        u = min(1.0, max(0.0, u))
        out[b] = 1.0 - (1.0 - p) * u if p >= 0.5 else p * u
    return out
