"""Choosing a worker without looking at every worker.

A worker's cost is ``multiplier * (rank + constant - overlap * per_block)``
(``scoring.py``): the multiplier is the same for every member of a ``Group``, the constant
the same for every member of a block size, and the rank is what ``LoadOrder`` sorts a
group's free members by. So for a request:

* among the members of an eligible group that have no prefix overlap, the one first in
  the group's order (skipping excluded keys) is the cheapest: one look per group;
* a worker with a prefix overlap is cheaper than its rank alone says: each of those (the
  overlap source reports them, ``prefix.OverlapSource``) is costed on its own.

The minimum over both is the brute-force minimum: a group's first member may itself have
an overlap, but then its own cost is lower still and is among the second kind. A decision
costs O(eligible groups + workers with overlap + excluded keys), not O(workers); the
eligible groups of a model and constraint set, with their multipliers, are computed once
and kept until a group appears or disappears.

Ties, at temperature 0: between groups (or overlap workers) at the same cost the injected
``random.Random`` picks; within a group, the member that has been at that load longest
goes first, so equally loaded workers take turns.

Temperature ``t > 0`` samples among a bounded set: the ``sample_candidates`` cheapest free
eligible workers (a lazy merge of the groups' orders, plus the overlap workers), with the
same softmax as before, its costs normalized over that set. Workers outside it are never
picked; when every free eligible worker fits in the set (small fleets) it is exactly the
softmax over all of them.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from dynamod.router.groups import Group
from dynamod.router.knobs import RouterKnobs
from dynamod.router.scoring import RequestShape, multiplier, select
from dynamod.router.types import RouteRequest

GroupOf = Callable[[str], Group | None]
Scored = tuple[Group, float, float]
"""An eligible group with the request's preferred-taint weight sum and multiplier."""

# Constraint sets whose scored groups are remembered; past this many the memory starts
# over (clients choose the constraints, so they must not be able to grow it without end).
SCORED_CACHE = 1024


@dataclass(frozen=True, slots=True)
class Pick:
    """A free eligible worker and what the decision knew of it."""

    group: Group
    key: str
    overlap: int
    """Leading prompt blocks the worker holds (before clamping to the request's blocks)."""
    preference: float
    """Sum of the request's preferred weights the worker's taints match."""
    estimate: float
    """Its cost (``RequestShape.estimate``)."""


class Chooser:
    """Picks workers for one router (module docstring). ``knobs`` may be replaced."""

    def __init__(self, knobs: RouterKnobs, rng: random.Random, group_of: GroupOf) -> None:
        self.knobs = knobs
        self._rng = rng
        self._group_of = group_of
        self._scored: dict[object, tuple[tuple[Group, ...], tuple[Scored, ...]]] = {}

    def choose(
        self, request: RouteRequest, groups: tuple[Group, ...], overlaps: Mapping[str, int]
    ) -> Pick | None:
        """The worker for ``request`` among the free members of ``groups`` (the eligible
        groups of its model), or None when none is free."""
        scored = self.scored(request, groups)
        if self.knobs.temperature == 0.0:
            return self._cheapest(request, scored, overlaps)
        found = self._sample_set(request, scored, overlaps)
        if not found:
            return None
        return found[select([p.estimate for p in found], self.knobs.temperature, self._rng)]

    def scored(self, request: RouteRequest, groups: tuple[Group, ...]) -> tuple[Scored, ...]:
        """``groups`` with the request's weight sum and multiplier, remembered for as long
        as the table hands out the same ``groups``."""
        constraints = request.constraints
        key = (
            request.model,
            constraints.required_taints,
            tuple(constraints.preferred_taints.items()),
        )
        found = self._scored.get(key)
        if found is not None and found[0] is groups:
            return found[1]
        preferred = constraints.preferred_taints
        scored = []
        for group in groups:
            weight = 0.0
            for taint, value in preferred.items():
                if taint in group.held:
                    weight += value
            scored.append((group, weight, multiplier(weight) if weight else 1.0))
        if len(self._scored) >= SCORED_CACHE:
            self._scored.clear()
        self._scored[key] = (groups, tuple(scored))
        return self._scored[key][1]

    def _cheapest(
        self, request: RouteRequest, scored: tuple[Scored, ...], overlaps: Mapping[str, int]
    ) -> Pick | None:
        shapes: dict[int, RequestShape] = {}
        exclude = request.exclude
        best = math.inf
        ties: list[tuple[Group, str, int, float]] = []
        for group, weight, factor in scored:
            entry = group.free.first(exclude) if exclude else group.free.head
            if entry is None:
                continue
            shape = shapes.get(group.block_size)
            if shape is None:
                shape = shapes[group.block_size] = self._shape(request, group)
            estimate = factor * (entry[0] + shape.constant)
            if estimate < best:
                best, ties = estimate, [(group, entry[2], 0, weight)]
            elif estimate == best:
                ties.append((group, entry[2], 0, weight))
        for pick in self._overlapping(request, scored, overlaps, shapes):
            if pick.estimate < best:
                best, ties = pick.estimate, [(pick.group, pick.key, pick.overlap, pick.preference)]
            elif pick.estimate == best:
                ties.append((pick.group, pick.key, pick.overlap, pick.preference))
        if not ties:
            return None
        group, key, overlap, weight = ties[0] if len(ties) == 1 else self._rng.choice(ties)
        return Pick(group, key, overlap, weight, best)

    def _shape(self, request: RouteRequest, group: Group) -> RequestShape:
        return RequestShape.of(self.knobs, group.block_size, request.prompt_tokens)

    def _overlapping(
        self,
        request: RouteRequest,
        scored: tuple[Scored, ...],
        overlaps: Mapping[str, int],
        shapes: dict[int, RequestShape],
    ) -> Iterator[Pick]:
        """Every free eligible worker with an overlap, costed with it."""
        if not overlaps:
            return
        eligible = {id(g): (w, f) for g, w, f in scored}
        for key, depth in overlaps.items():
            group = self._group_of(key)
            factors = eligible.get(id(group)) if group is not None else None
            if group is None or factors is None or key in request.exclude or depth <= 0:
                continue
            rank = group.free.rank(key)
            if rank is None:
                continue  # busy
            shape = shapes.get(group.block_size)
            if shape is None:
                shape = shapes[group.block_size] = self._shape(request, group)
            weight, factor = factors
            yield Pick(group, key, depth, weight, shape.estimate(factor, rank, depth))

    def _sample_set(
        self, request: RouteRequest, scored: tuple[Scored, ...], overlaps: Mapping[str, int]
    ) -> list[Pick]:
        """The ``sample_candidates`` cheapest free eligible workers, cheapest first."""
        size = self.knobs.sample_candidates
        shapes: dict[int, RequestShape] = {}
        with contextlib.ExitStack() as stack:
            streams = []
            for group, weight, factor in scored:
                order = group.free.ascending(request.exclude)
                stack.enter_context(contextlib.closing(order))
                shape = shapes.get(group.block_size) or self._shape(request, group)
                shapes[group.block_size] = shape
                streams.append(_picks(group, weight, factor, shape, order))
            merged = itertools.islice(heapq.merge(*streams), size)
            found = {pick.key: pick for _, _, pick in merged}
        for pick in self._overlapping(request, scored, overlaps, shapes):
            found[pick.key] = pick  # its own cost is below the one it had in its group
        return sorted(found.values(), key=lambda p: p.estimate)[:size]


def _picks(
    group: Group,
    weight: float,
    factor: float,
    shape: RequestShape,
    order: Iterator[tuple[float, int, str]],
) -> Iterator[tuple[float, str, Pick]]:
    """A group's free members as picks, cheapest first (their keys break ties, so the
    merge never compares two picks)."""
    for rank, _, key in order:
        estimate = shape.estimate(factor, rank)
        yield estimate, key, Pick(group, key, 0, weight, estimate)
