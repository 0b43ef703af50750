"""Counts: how many workers each pool (and each domain's share of it) should have.

Pure and exact. ``apportion`` is largest remainder (Hamilton) over the routable workers:
each pool gets the floor of its exact quota ``n * w / sum(w)``, then the seats left go to
the largest fractional parts, ties by the pool taints' sorted order. Weights are read as
the decimals they were written as (``0.1`` is one tenth, not the nearest binary float),
with exact fractions, so every machine finds the same ties. Each count stays within one of
its quota (the quota rule, which divisor methods such as D'Hondt can break); the price is
the Alabama paradox: one more worker can cost a pool a seat (rare, and expected by the
tests). ``spread`` splits each pool's count over the values of a topology domain.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

from dynamod.pools.policy import Weight

Domain = str | None
"""A topology domain's value (``spread_by``); None for workers without that domain."""
Cell = tuple[Domain, str]
"""(domain value, pool taint): one cell of a spread."""


def apportion(n: int, weights: Mapping[str, Weight], *, minimum: int = 0) -> dict[str, int]:
    """Split ``n`` workers over the pools by largest remainder; ties by sorted taint.

    With ``minimum``, each pool gets at least ``min(minimum, n // len(weights))``: the
    minimum when the fleet allows it, else as much of it as every pool can have alike. A
    pool whose count falls short is held at that floor and the rest is apportioned again
    among the others by largest remainder, until none falls short.

    A weight may be 0 when another is positive (``elastic.allot`` splits by wants, and a
    pool may want none): such a pool gets the floor and never a remainder seat.
    """
    if n < 0 or minimum < 0 or not weights:
        raise ValueError(f"apportion needs n >= 0, minimum >= 0 and pools: {n}, {minimum}")
    exact = {taint: exact_decimal(weight) for taint, weight in sorted(weights.items())}
    floor = min(minimum, n // len(exact))
    held: dict[str, int] = {}
    while True:
        counts = _largest_remainder(
            n - floor * len(held), {t: exact[t] for t in exact if t not in held}
        )
        short = [taint for taint, count in counts.items() if count < floor]
        if not short:
            return dict(sorted({**counts, **held}.items()))
        held.update(dict.fromkeys(short, floor))


def _largest_remainder(n: int, weights: Mapping[str, Fraction]) -> dict[str, int]:
    total = sum(weights.values())
    quotas = {taint: n * weight / total for taint, weight in weights.items()}
    counts = {taint: math.floor(quota) for taint, quota in quotas.items()}
    left = n - sum(counts.values())
    by_remainder = sorted(quotas, key=lambda t: (counts[t] - quotas[t], t))
    for taint in by_remainder[:left]:
        counts[taint] += 1
    return counts


def exact_decimal(weight: Weight | Fraction) -> Fraction:
    """A weight as the decimal it was written as: ``0.1`` is exactly one tenth."""
    return Fraction(repr(weight)) if isinstance(weight, float) else Fraction(weight)


def spread(
    wanted: Mapping[str, int],
    sizes: Mapping[Domain, int],
    have: Mapping[Cell, int] | None = None,
) -> dict[Domain, dict[str, int]]:
    """Split each pool's count over the domains in proportion to their routable workers.

    Cell (domain d, pool p) has the exact quota ``sizes[d] * wanted[p] / n``; its count is
    that quota's floor or ceiling, every domain's counts sum to its size and every pool's
    to its count (such a rounding always exists). The cells rounded up are chosen
    greedily: first those already holding more than their floor (``have``, so a change
    moves few workers), then by largest fractional part, then by pool taint and domain
    (None first); when that greedy order cannot be completed, the shortest augmenting
    path swaps which cells are rounded up (a bipartite matching step), so a valid
    rounding is always reached and always the same one for the same inputs.
    """
    domains = sorted(sizes, key=_domain_order)
    counts, fraction = _floors(wanted, sizes, domains)
    row = {d: sizes[d] - sum(counts[d].values()) for d in domains}
    column = {p: wanted[p] - sum(counts[d][p] for d in domains) for p in wanted}
    cells = list(fraction)  # the cells with a fractional part, by domain then pool
    held = have or {}

    def order(cell: Cell) -> tuple[bool, Fraction, str, tuple[bool, str]]:
        d, pool = cell
        return (held.get(cell, 0) <= counts[d][pool], -fraction[cell], pool, _domain_order(d))

    up: set[Cell] = set()
    for d, pool in sorted(cells, key=order):
        if row[d] > 0 and column[pool] > 0:
            up.add((d, pool))
            row[d] -= 1
            column[pool] -= 1
    _complete(cells, up, row, column)
    for d, pool in up:
        counts[d][pool] += 1
    return counts


def _floors(
    wanted: Mapping[str, int], sizes: Mapping[Domain, int], domains: Sequence[Domain]
) -> tuple[dict[Domain, dict[str, int]], dict[Cell, Fraction]]:
    """Each cell's floor, and the fractional part of those whose quota is not whole."""
    n = sum(sizes.values())
    counts: dict[Domain, dict[str, int]] = {d: {} for d in domains}
    fraction: dict[Cell, Fraction] = {}
    for d in domains:
        for pool in sorted(wanted):
            quota = Fraction(sizes[d] * wanted[pool], n) if n else Fraction(0)
            counts[d][pool] = math.floor(quota)
            if quota != counts[d][pool]:
                fraction[d, pool] = quota - counts[d][pool]
    return counts, fraction


def _complete(
    cells: Sequence[Cell],
    up: set[Cell],
    row: dict[Domain, int],
    column: dict[str, int],
) -> None:
    """Augment ``up`` until every row and column need is met (bipartite b-matching)."""
    for domain, need in list(row.items()):
        for _ in range(need):
            path = _augmenting_path(domain, cells, up, column)
            up.symmetric_difference_update(path)
            row[domain] -= 1
            column[path[0][1]] -= 1  # path[0] enters the pool that was short


def _augmenting_path(
    start: Domain,
    cells: Sequence[Cell],
    up: set[Cell],
    column: Mapping[str, int],
) -> list[Cell]:
    """Breadth first from domain ``start``: a cell not rounded up into a pool, then a
    rounded-up cell of that pool back to its domain, and so on, until a pool still short."""
    into: dict[str, Cell] = {}
    reached: dict[Domain, Cell | None] = {start: None}
    frontier = [start]
    while frontier:
        following: list[Domain] = []
        for cell in [c for c in cells if c[0] in frontier and c not in up]:
            if cell[1] in into:
                continue
            into[cell[1]] = cell
            if column[cell[1]] > 0:
                return _path(cell, into, reached)
            for back in cells:
                if back[1] == cell[1] and back in up and back[0] not in reached:
                    reached[back[0]] = back
                    following.append(back[0])
        frontier = following
    raise AssertionError("no rounding of the spread exists; the quotas are inconsistent")


def _path(
    last: Cell,
    into: Mapping[str, Cell],
    reached: Mapping[Domain, Cell | None],
) -> list[Cell]:
    path = [last]
    via = reached[last[0]]
    while via is not None:
        cell = into[via[1]]
        path += [via, cell]
        via = reached[cell[0]]
    return path


def _domain_order(domain: Domain) -> tuple[bool, str]:
    return (domain is not None, domain or "")
