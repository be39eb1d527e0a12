"""Singular values and vectors of a gradient: the decompositions every spectral projector (svd, plumage) and the
sharded refresh build their bases from.

    thin_svd      torch.linalg.svd as galore-torch calls it, retried in float64 on non-convergence
    eigh_gram     σ = √λ and the eigenvectors of a Gram matrix (G Gᵀ or Gᵀ G) as a `Singular`: the route of
                  solver="gram"/"gram64" and of FSDP2
    decompose     the solver's choice between them, as a `Singular` (σ and a way to cut factors)
    decompose_batch   the same for a stack of same-shaped gradients in one batched call (optimizers/batched_refresh.py)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch


class Singular(NamedTuple):
    sigma: torch.Tensor  # descending
    factor: Callable[[int, torch.Tensor | slice], torch.Tensor]  # (mode, columns) -> dim_mode × r
    # whether the decomposed gradient was finite and not zero (a 0-d bool tensor, not yet read; None: known good): a
    # basis that reads σ on the host reads it with σ and gives up when False (Projector.refresh)
    usable: torch.Tensor | None = None


def thin_svd(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """U, σ, Vᴴ of a finite float matrix (σ descending), or None if no solver converges.

    The same call galore-torch makes, so bases match it exactly. When the solver fails to converge (it
    happens on ill-conditioned gradients) it is retried in float64 before giving up; the caller then keeps
    the previous basis instead of stalling or crashing the run.
    """
    try:
        return torch.linalg.svd(matrix, full_matrices=False)
    except RuntimeError:
        pass
    try:
        u, s, vh = torch.linalg.svd(matrix.double(), full_matrices=False)
    except RuntimeError:
        return None
    return u.to(matrix.dtype), s.to(matrix.dtype), vh.to(matrix.dtype)


def singular_factor(u: torch.Tensor, vh: torch.Tensor, mode: int, columns: torch.Tensor | slice) -> torch.Tensor:
    """Chosen singular vectors of one side as a dim × r factor: U[:, columns] (mode 0) or V[:, columns].

    Copied out of U / Vᴴ so the full decomposition is not kept alive; the right factor is a transposed view
    of a compact r × n block, the layout galore-torch multiplies with.
    """
    return u[:, columns].clone() if mode == 0 else vh[columns].clone().T


def gram_eigh(grad: torch.Tensor, mode: int, precise: bool = False) -> Singular | None:
    """The singular values (descending) of `grad` and its side-`mode` singular vectors, from its Gram matrix.

    G Gᵀ = U Σ² Uᵀ (mode 0), Gᵀ G = V Σ² Vᵀ (mode 1): one eigh of a min(m, n)² matrix instead of an SVD of G.
    Squaring loses the smallest singular values to rounding (clamped at 0); the top ones, which the
    projection keeps, are unaffected, and an eigenbasis is orthonormal, which is all PLUMAGE's
    unbiasedness needs. float64 retry as in thin_svd; None if eigh fails in both.

    precise: form the Gram and solve in float64 (solver "gram64"). Squaring in float32 leaves σ below ~1e-3 σ₁ with
    large relative errors, so PLUMAGE's p over a steep full spectrum are wrong (tests/projectors/test_solver_accuracy.py);
    in float64 σ and p are more accurate than float32 SVD's, and the vectors too.
    """
    return eigh_gram(_gram(grad, mode, precise), grad.dtype)


GRAM_BLOCK_ROWS = 192  # a CPU Gram is formed in row blocks of at least this many rows (at most GRAM_MAX_BLOCKS)
GRAM_MAX_BLOCKS = 4


def _gram(grad: torch.Tensor, mode: int, precise: bool) -> torch.Tensor:
    """G Gᵀ (mode 0) or Gᵀ G (mode 1) of one matrix or of each of a stack, for eigh; in float64 when `precise`.

    On a CPU only the lower triangle's row blocks are computed (above the diagonal blocks the matrix is zero), in
    column-major layout: eigh reads the lower triangle alone and copies its input into column-major order first, which
    for a row-major 1024² matrix is a transposing copy of 3 ms (1 ms at 768²). Four row blocks take 0.58x (768²) to
    0.70x (1024²) the time of the whole product. On other devices the whole product: that their eigh reads one
    triangle only is not tested here.
    """
    source = grad.double() if precise else grad
    rows = source if mode == 0 else source.mT  # the Gram is rows · rowsᵀ
    if source.device.type != "cpu":
        return rows @ rows.mT
    size = rows.shape[-2]
    blocks = max(1, min(GRAM_MAX_BLOCKS, size // GRAM_BLOCK_ROWS))
    edges = [size * block // blocks for block in range(blocks + 1)]
    # buffer = Gramᵀ, row-major: its upper triangle is the Gram's lower one, and buffer.mT is the Gram, column-major
    buffer = rows.new_zeros((*rows.shape[:-2], size, size))
    for start, end in zip(edges[:-1], edges[1:], strict=True):
        # Gram[start:end, :end] = rows[start:end] rows[:end]ᵀ, written transposed into buffer[:end, start:end]
        torch.matmul(rows[..., :end, :], rows[..., start:end, :].mT, out=buffer[..., :end, start:end])
    return buffer.mT


def _gram_route(shape: tuple[int, ...], modes: tuple[int, ...], solver: str) -> bool:
    """Whether a gradient whose matrices have `shape` (the last two dims) is decomposed through its Gram: solver
    "gram"/"gram64", one side projected, and that side the smaller."""
    m, n = shape[-2:]
    return solver.startswith("gram") and len(modes) == 1 and (m, n)[modes[0]] <= (m, n)[1 - modes[0]]


def eigh_gram(gram: torch.Tensor, dtype: torch.dtype, noise_floor: bool = False) -> Singular | None:
    """σ = √λ (descending) of a symmetric PSD Gram matrix and its eigenvectors as singular vectors, cast to `dtype`.

    Rounding can leave tiny negative eigenvalues: they are clamped to σ = 0 (a direction that carries nothing),
    so σ is never NaN and stays sorted. Also the route of a sharded refresh, whose Gram is all-reduced over ranks.

    noise_floor: also zero every λ < size · ε · λ_max (ε of the Gram's dtype), the rounding error of forming the
    Gram. Squaring turns a rounding-level singular value of G (ε·σ₁) into σ = √(ε)·σ₁, large enough for PLUMAGE to
    give such noise directions a real inclusion probability and then a 1/p-scaled step; at σ = 0 they get none.
    """
    for dtype_tried in (gram.dtype, torch.float64):
        try:
            eigenvalues, eigenvectors = torch.linalg.eigh(gram.to(dtype_tried))
            break
        except RuntimeError:
            continue
    else:
        return None
    return _eigh_singular(eigenvalues, eigenvectors, gram.dtype, dtype, noise_floor)


def _eigh_singular(eigenvalues: torch.Tensor, eigenvectors: torch.Tensor, gram_dtype: torch.dtype, dtype: torch.dtype,
                   noise_floor: bool) -> Singular:
    """One matrix's eigh output (ascending) as a Singular: σ = √λ descending, in `dtype`, and factors cut from the
    eigenvectors in descending order (descending_columns).

    The eigenvectors are held in `dtype` until cut: a float64 Gram's (solver "gram64") are cast at once, so a
    decomposition that waits for its refresh (refresh_batch > 1 prepares a whole batch first) holds n² floats of the
    gradient's dtype, not n² doubles and the batch's whole float64 stack. Casting before the cut or after it gives the
    same values."""
    eigenvalues = eigenvalues.flip(-1)
    if noise_floor:
        floor = eigenvalues.shape[-1] * torch.finfo(gram_dtype).eps * eigenvalues[..., :1].clamp_min(0)
        eigenvalues = torch.where(eigenvalues < floor, torch.zeros_like(eigenvalues), eigenvalues)
    sigma = eigenvalues.clamp_min(0).sqrt().to(dtype)
    held = eigenvectors.to(dtype)  # no copy when eigh ran in `dtype`
    return Singular(sigma, lambda mode, columns: descending_columns(held, columns))


def descending_columns(ascending: torch.Tensor, columns: torch.Tensor | slice) -> torch.Tensor:
    """A copy of columns `columns` of eigh's eigenvectors counted from the largest eigenvalue: column j is `ascending`'s
    column n − 1 − j. Only those columns are copied, where refreshes until session 30 flipped the whole n × n first (a
    copy of n² for a basis of r; small next to eigh: 0.1-0.2 % of a 130M or 350M layer's decompositions on one thread).
    The values and the layout (column-major for a slice, as eigh's output; row-major for an index tensor) are those of
    a copy cut from the flipped whole."""
    n = ascending.shape[-1]
    if isinstance(columns, slice):
        start, stop, step = columns.indices(n)
        if step != 1:
            raise ValueError(f"descending_columns takes a slice of consecutive columns or an index tensor, got {columns}")
        return ascending[..., n - max(stop, start):n - start].flip(-1)
    return ascending[..., n - 1 - columns]


def decompose(grad: torch.Tensor, modes: tuple[int, ...], solver: str) -> Singular | None:
    """Singular values of `grad` and a way to cut factors out of the singular vectors of the `modes` sides.

    solver "gram" (float32) and "gram64" (float64) take the eigh route when one side is projected and it is the
    smaller one (the usual case: GaLore's std projects the smaller side); otherwise, and for solver "svd",
    torch.linalg.svd.
    """
    if _gram_route(grad.shape, modes, solver):
        return gram_eigh(grad, modes[0], precise=solver == "gram64")
    result = thin_svd(grad)
    if result is None:
        return None
    u, sigma, vh = result
    return Singular(sigma, lambda mode, columns: singular_factor(u, vh, mode, columns))


def decompose_batch(grads: torch.Tensor, modes: tuple[int, ...], solver: str) -> list[Singular] | None:
    """decompose() of each matrix of a stack (b × m × n) in one batched torch.linalg call; None when that call fails
    (a member whose gradient is not finite, or a solver that does not converge), so the caller decomposes them one by
    one, with decompose()'s float64 retry.

    Each member's σ and vectors are those its own decompose() gives: on a CPU the batched call runs the same LAPACK
    routine on each matrix (tests/optimizers/test_batched_refresh.py checks bases bit-identical); a GPU may choose
    another algorithm for a batch. The factors cut out of a member are copies, so nothing keeps the stack alive.
    """
    try:
        if _gram_route(grads.shape, modes, solver):
            grams = _gram(grads, modes[0], precise=solver == "gram64")
            eigenvalues, eigenvectors = torch.linalg.eigh(grams)
            return [_eigh_singular(eigenvalues[i], eigenvectors[i], grams.dtype, grads.dtype, noise_floor=False)
                    for i in range(grads.shape[0])]
        u, sigma, vh = torch.linalg.svd(grads, full_matrices=False)
    except RuntimeError:
        return None
    return [Singular(sigma[i], lambda mode, columns, u=u[i], vh=vh[i]: singular_factor(u, vh, mode, columns))
            for i in range(grads.shape[0])]
