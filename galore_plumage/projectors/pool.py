"""What a refresh makes: a Basis (one factor per projected mode, PLUMAGE's 1/p) and, for PLUMAGE with resample_every,
the Pool of candidates its later draws choose from."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Basis:
    """What a subclass makes at a refresh."""

    factors: dict[int, torch.Tensor]  # mode -> dim_k × r_k
    inv_p: torch.Tensor | None = None  # 1/p of the sampled directions (one-sided PLUMAGE), float
    stats: dict[str, float] = field(default_factory=dict)
    pool: Pool | None = None  # what a resample draws from until the next refresh (PLUMAGE with resample_every)


@dataclass
class Pool:
    """The candidates of a refresh that later draws choose from: the top K singular vectors of one side
    (dim × K) and their inclusion probabilities (K, float64 on the CPU, Σp = rank).

    Stored with the current draw's r vectors first, so the basis is the view vectors[:, :r] and costs no memory of
    its own; `order` gives each stored column's place in the descending-σ order the draws are made in. A draw
    rearranges the pool in place (swap_in), so a view of the basis taken before a draw follows it."""

    vectors: torch.Tensor
    p: torch.Tensor
    order: torch.Tensor | None = None  # None (a new pool, or a checkpoint before session 8): descending-σ order
    # some vector may be left out of a draw (a p below 1): read once, as draws only permute p
    leaves_some_out: bool = field(init=False)

    def __post_init__(self):
        if self.order is None:
            self.order = torch.arange(self.p.numel())
        self.leaves_some_out = bool((self.p < 1).any())

    def canonical(self) -> torch.Tensor:
        """p in descending-σ order."""
        return Pool.canonical_together([self])[0]

    @staticmethod
    def canonical_together(pools: list[Pool]) -> torch.Tensor:
        """canonical() of pools of one size, as the rows of one matrix (one scatter for all of them)."""
        stored = torch.stack([pool.p for pool in pools])
        return torch.empty_like(stored).scatter_(1, torch.stack([pool.order for pool in pools]), stored)

    def arranged(self, chosen: torch.Tensor) -> tuple[Pool, torch.Tensor]:
        """This pool stored with the `chosen` vectors (descending-σ indices) first, and those vectors as a view."""
        order = self.order
        stored_at = torch.empty_like(order)
        stored_at[order] = torch.arange(order.numel())
        rest = torch.ones(order.numel(), dtype=torch.bool)
        rest[chosen] = False
        new_order = torch.cat([chosen, rest.nonzero().flatten()])
        columns = stored_at[new_order]
        pool = Pool(self.vectors[:, columns.to(self.vectors.device)], self.p[columns], new_order)
        return pool, pool.vectors[:, : chosen.numel()]

    def swap_in(self, chosen: torch.Tensor) -> torch.Tensor:
        """Make the `chosen` vectors (descending-σ indices, as many as the basis holds) the first stored ones, in
        place: a vector already among the first keeps its column, and each one that enters swaps columns with one
        that leaves. Only the columns that change are copied (arranged() copies the whole pool). Returns the
        columns that changed vector (CPU): the rows whose moments start again from zero."""
        return Pool.swap_in_together([self], chosen.unsqueeze(0))[0]

    @staticmethod
    def swap_in_together(pools: list[Pool], chosen: torch.Tensor) -> list[torch.Tensor]:
        """swap_in of pools of one size, row k of `chosen` (W × rank) for pool k: which stored columns leave and which
        enter found for all pools at once, the copies made pool by pool."""
        rank = chosen.shape[1]
        orders = torch.stack([pool.order for pool in pools])
        # whether the vector stored at each column is wanted: the first `rank` columns keep theirs where it is
        wanted = torch.zeros(orders.shape, dtype=torch.bool).scatter_(1, chosen, True).gather(1, orders)
        leaving, entering = ~wanted[:, :rank], wanted[:, rank:]
        return [pool.swap_columns(out.nonzero().flatten(), rank + into.nonzero().flatten())
                for pool, out, into in zip(pools, leaving, entering, strict=True)]

    def swap_columns(self, leaving: torch.Tensor, entering: torch.Tensor) -> torch.Tensor:
        """Swap the stored columns `leaving` (among the first) and `entering` (after them), pairwise in order."""
        columns, sources = torch.cat([leaving, entering]), torch.cat([entering, leaving])
        # one copy of the indices to the device, without waiting on it (non_blocking: no host synchronisation)
        moves = torch.stack([columns, sources]).to(self.vectors.device, non_blocking=True)
        self.vectors[:, moves[0]] = self.vectors[:, moves[1]]  # the right side is gathered first
        self.p[columns] = self.p[sources]
        self.order[columns] = self.order[sources]
        return leaving


def stored_in_bf16(basis: Basis) -> Basis:
    """`basis` with its pool stored in bfloat16 and its factor a view of the pool's first columns, as before: half the
    pool's memory; p and 1/p keep their dtype."""
    ((mode, factor),) = basis.factors.items()
    vectors = basis.pool.vectors.to(torch.bfloat16)
    pool = Pool(vectors, basis.pool.p, basis.pool.order)
    return Basis({mode: vectors[:, : factor.shape[1]]}, basis.inv_p, basis.stats, pool)
