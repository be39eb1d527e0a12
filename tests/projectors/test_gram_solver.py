"""solver="gram": singular vectors from eigh of the projected side's Gram matrix instead of a full SVD.

It must give the same singular values and (up to sign) the same top singular vectors as torch.linalg.svd on
a spectrum with gaps, take the eigh route only when the projected side is the smaller one, and keep PLUMAGE
unbiased with the closed-form variance — by Monte Carlo, with the tolerances of test_plumage_estimator.py. The
same eigh builds a basis from a Gram matrix alone (Projector.refresh_from_gram), which is how FSDP2 refreshes.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from galore_plumage import build_optimizer
from galore_plumage.optimizers import PLUMAGE_ADAFACTOR_DRAWS
from galore_plumage.projectors import PlumageProjector, SVDProjector, build_projector, inclusion_probabilities
from galore_plumage.projectors import spectrum as spectrum_module
from galore_plumage.projectors.spectrum import decompose, gram_eigh

SIGMA = [1.0 / i for i in range(1, 17)]  # distinct, gapped: vectors are defined up to sign
K, DRAWS = 4, 600


@pytest.mark.parametrize("mode", [0, 1])
def test_gram_eigh_matches_svd(spectral_matrix, mode):
    """Singular values to float32 rounding; each top singular vector of the projected side up to its sign."""
    g, u, sigma, v = spectral_matrix(16, 40, SIGMA, seed=3, dtype=torch.float32)
    g = g if mode == 0 else g.T  # the projected side is the smaller one (16)
    decomposition = gram_eigh(g, mode)
    vectors, values = decomposition.factor(mode, slice(None)), decomposition.sigma
    torch.testing.assert_close(values[:16].double(), sigma, rtol=1e-4, atol=1e-5)
    assert torch.all(values[16:] < 1e-3)  # the rank-16 matrix has no more energy
    cosines = (vectors[:, :8].double() * u[:, :8]).sum(0).abs()
    torch.testing.assert_close(cosines, torch.ones(8, dtype=torch.float64), rtol=0, atol=1e-4)
    identity = vectors.T @ vectors
    torch.testing.assert_close(identity, torch.eye(identity.shape[0]), rtol=0, atol=1e-5)  # orthonormal


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("precise", [False, True])
def test_a_cpu_gram_is_its_lower_triangle_in_blocks_laid_out_for_eigh(mode, precise):
    """What eigh reads of the Gram (its lower triangle) is the product's; what lies far above the diagonal is never
    computed (the blocks' saving); the layout is column-major (eigh's own, so it does no transposing copy); a stack's
    members are each the Gram their matrix alone gives, to the bit."""
    generator = torch.Generator().manual_seed(5)
    g = torch.randn(4, 800, 1000, generator=generator)  # the projected side: 800 rows, more than two blocks' worth
    g = g if mode == 0 else g.mT
    gram = spectrum_module._gram(g[1], mode, precise)
    source = g[1].double()
    exact = source @ source.T if mode == 0 else source.T @ source
    assert gram.shape == (800, 800) and gram.dtype == (torch.float64 if precise else torch.float32)
    tolerance = 1e-12 if precise else 1e-5
    torch.testing.assert_close(torch.tril(gram).double(), torch.tril(exact), rtol=0, atol=tolerance * exact.abs().max())
    assert torch.count_nonzero(torch.triu(gram, diagonal=400)) == 0
    assert gram.mT.is_contiguous()
    # float32 eigh's own error is ~size · ε · λ_max, the same for the whole float32 product
    eigen_tolerance = 1e-12 if precise else 800 * torch.finfo(torch.float32).eps
    torch.testing.assert_close(torch.linalg.eigvalsh(gram).double(), torch.linalg.eigvalsh(exact), rtol=0,
                               atol=eigen_tolerance * exact.abs().max())
    assert torch.equal(spectrum_module._gram(g, mode, precise)[1], gram)


def test_gram_route_only_for_a_single_smaller_side(spectral_matrix, monkeypatch):
    """The larger side, or both sides ('full'), would need the big Gram matrix: those fall back to the SVD."""
    g, *_ = spectral_matrix(16, 40, SIGMA, seed=0, dtype=torch.float32)
    calls = []
    real_svd, real_gram = spectrum_module.thin_svd, spectrum_module.gram_eigh
    monkeypatch.setattr(spectrum_module, "thin_svd", lambda m: calls.append("svd") or real_svd(m))
    monkeypatch.setattr(spectrum_module, "gram_eigh",
                        lambda m, k, precise=False: calls.append("gram64" if precise else "gram") or real_gram(m, k))
    for solver in ("gram", "gram64"):
        for modes, expected in [((0,), solver), ((1,), "svd"), ((0, 1), "svd")]:
            calls.clear()
            decompose(g, modes, solver)
            assert calls == [expected], (solver, modes)
    calls.clear()
    decompose(g, (0,), "svd")
    assert calls == ["svd"]


def test_svd_projector_with_gram_spans_the_same_subspace(spectral_matrix):
    """GaLore's projector through either solver keeps the same top-r subspace: P Pᵀ G agrees."""
    g, *_ = spectral_matrix(16, 40, SIGMA, seed=1, dtype=torch.float32)
    backs = []
    for solver in ("svd", "gram"):
        projector = SVDProjector(K, proj_type="std", update_proj_gap=10, solver=solver)
        projector.refresh(g, 0)
        backs.append(projector.project_back(projector.project(g)))
    torch.testing.assert_close(backs[1], backs[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("solver", ["gram", "gram64"])
def test_a_non_finite_gradient_keeps_the_basis_through_the_gram(solver):
    """eigh of a NaN Gram returns NaN where an SVD raises: the basis made from it is rejected with the refresh's
    check, and measuring how far it moved (ρ) must not raise first (it did before session 20)."""
    g = torch.randn(40, 72, generator=torch.Generator().manual_seed(2))  # LAPACK's eigh raises on NaN below n = 26 only
    projector = SVDProjector(K, proj_type="std", update_proj_gap=10, solver=solver)
    assert projector.refresh(g, 0)
    basis = projector.factors[0].clone()
    bad = g.clone()
    bad[3, 5] = float("nan")
    assert not projector.refresh(bad, 10)
    assert torch.equal(projector.factors[0], basis) and projector.stats["skipped_refreshes"] == 1


@pytest.mark.parametrize("side", ["left", "right"])
def test_plumage_with_gram_is_unbiased_with_the_closed_form_variance(spectral_matrix, check_draws, side):
    """Over refreshes, project_back(project(G)) averages to G, and its mean squared error is Σ(1/p − 1)σ²."""
    g, _, sigma, _ = spectral_matrix(24, 16, SIGMA, seed=0)
    g = g.T.contiguous() if side == "left" else g  # left projects rows: make them the smaller side (16 × 24)
    _, p = inclusion_probabilities(sigma, K)
    variance = ((1.0 / p - 1.0) * sigma**2).sum().item()
    projector = PlumageProjector(K, proj_type=side, update_proj_gap=1, seed=5, solver="gram")
    estimates = []
    for step in range(DRAWS):
        assert projector.maybe_refresh(g, step)
        estimates.append(projector.project_back(projector.project(g)))
    check_draws(torch.stack(estimates), g, variance)


def test_solver_reaches_the_projectors_and_bad_values_are_named():
    model = torch.nn.Sequential()
    model.add_module("attn", torch.nn.Linear(32, 16))
    optimizer = build_optimizer("plumage_adamw", model, lr=1e-3, rank=4, solver="gram")
    model(torch.randn(3, 32)).square().sum().backward()
    optimizer.step()
    projector = optimizer.projector_for(model.attn.weight, optimizer.param_groups[-1])
    assert projector.solver == "gram" and projector.ready
    with pytest.raises(ValueError, match="'qr'"):
        build_optimizer("plumage_adamw", model, lr=1e-3, rank=4, solver="qr")


@pytest.mark.parametrize(("name", "options", "expected"), [
    ("plumage_adamw", {}, "gram"),  # the default: GaLore's top-r basis, solver "auto"
    ("plumage_adamw8bit", {}, "gram"),
    ("plumage_adamw", {"projector": "plumage"}, "gram"),  # PLUMAGE's draws: p over the pool of the top 2r σ
    ("plumage_adamw", {"projector": "plumage", "pool_factor": 4}, "gram64"),  # a pool deeper than the check covers
    ("plumage_adamw", {"projector": "plumage", "resample_every": 0, "max_inv_p": None}, "gram64"),  # the paper's p
    ("galore_adamw", {}, "svd"),  # galore-torch's call, so its bases stay galore-torch's
    ("galore_adamw", {"solver": "auto"}, "gram"),
    ("plumage_adafactor", {}, "gram"),  # GaLore's top-r basis since session 81
    ("plumage_adafactor", PLUMAGE_ADAFACTOR_DRAWS, "svd"),  # its draws of sessions 42-80, refreshed as they were
])
def test_auto_solver_on_a_cpu_is_the_gram_where_the_top_2r_suffice_and_gram64_for_the_whole_spectrum(
        name, options, expected, monkeypatch):
    calls = []
    real_svd, real_gram = spectrum_module.thin_svd, spectrum_module.gram_eigh
    monkeypatch.setattr(spectrum_module, "thin_svd", lambda m: calls.append("svd") or real_svd(m))
    monkeypatch.setattr(spectrum_module, "gram_eigh", lambda m, k, precise=False: calls.append(
        "gram64" if precise else "gram") or real_gram(m, k, precise))
    model = torch.nn.Sequential()
    model.add_module("attn", torch.nn.Linear(32, 16))
    optimizer = build_optimizer(name, model, lr=1e-3, rank=4, **options)
    model(torch.randn(40, 32)).square().sum().backward()
    optimizer.step()
    projector = optimizer.projector_for(model.attn.weight, optimizer.param_groups[-1])
    assert projector.ready and projector.solver_on(torch.device("cpu")) == expected and calls == [expected]


def test_auto_solver_on_a_gpu_is_the_gram_too():
    """On an H200 the paper's p through float64's Gram took 0.25-0.32x the SVD's refresh (docs/step_time_cuda.md,
    session 35): solver "auto" is the same on a GPU as on a CPU."""
    cuda = torch.device("cuda")  # only the device's type is read: no GPU needed
    paper = PlumageProjector(rank=4, solver="auto")
    draws = PlumageProjector(rank=4, solver="auto", resample_every=1, max_inv_p=1.0)
    assert (paper.solver_on(cuda), draws.solver_on(cuda), SVDProjector(rank=4, solver="auto").solver_on(cuda)) == (
        "gram64", "gram", "gram")
    assert PlumageProjector(rank=4, solver="svd").solver_on(torch.device("cpu")) == "svd"  # a named one is kept


# ----------------------------------------------------------------- Projector.refresh_from_gram (FSDP2's refresh)
def test_refresh_from_gram_gives_the_basis_of_the_gradient(spectral_matrix):
    """What a sharded weight's ranks build from the all-reduced Gᵀ G is the right-side basis of G itself."""
    g, _, _, v = spectral_matrix(40, 16, SIGMA, seed=5, dtype=torch.float32)
    from_gradient = SVDProjector(4, proj_type="right", solver="gram")
    from_gram = SVDProjector(4, proj_type="right")
    assert from_gradient.refresh(g, 0)
    assert from_gram.refresh_from_gram(g.T @ g, tuple(g.shape), 0, torch.float32)
    cosines = (from_gram.factors[1].double() * v[:, :4]).sum(0).abs()
    torch.testing.assert_close(cosines, torch.ones(4, dtype=torch.float64), rtol=0, atol=1e-4)
    torch.testing.assert_close(from_gram.project(g).abs(), from_gradient.project(g).abs(), rtol=1e-4, atol=1e-5)
    assert from_gram.refresh_count == 1 and from_gram.stats["skipped_refreshes"] == 0


def test_refresh_from_gram_keeps_the_basis_for_a_zero_or_non_finite_gram(spectral_matrix):
    g, *_ = spectral_matrix(40, 16, SIGMA, seed=5, dtype=torch.float32)
    projector = PlumageProjector(4, proj_type="right")
    assert projector.refresh_from_gram(g.T @ g, tuple(g.shape), 0, torch.float32)
    basis = projector.factors[1].clone()
    bad = g.T @ g
    bad[0, 0] = float("nan")
    assert not projector.refresh_from_gram(bad, tuple(g.shape), 5, torch.float32)
    assert not projector.refresh_from_gram(torch.zeros(16, 16), tuple(g.shape), 6, torch.float32)
    assert torch.equal(projector.factors[1], basis) and projector.stats["skipped_refreshes"] == 2


def test_refresh_from_gram_names_what_it_cannot_do(spectral_matrix):
    g, *_ = spectral_matrix(40, 16, SIGMA, seed=5, dtype=torch.float32)
    with pytest.raises(ValueError, match="use proj_type='right'"):
        SVDProjector(4, proj_type="left").refresh_from_gram(g.T @ g, tuple(g.shape), 0, torch.float32)
    with pytest.raises(TypeError, match="cannot refresh from a Gram matrix"):
        build_projector("random", 4, proj_type="right").refresh_from_gram(g.T @ g, tuple(g.shape), 0, torch.float32)
    with pytest.raises(TypeError, match="cannot refresh from the shape alone"):
        SVDProjector(4, proj_type="right").refresh_seeded(tuple(g.shape), 0, torch.float32, g.device)


def test_refresh_seeded_draws_the_same_basis_as_a_refresh(spectral_matrix):
    """The random projector's basis depends on the seed and the shape only: the sharded refresh gets it bit for bit."""
    g, *_ = spectral_matrix(40, 16, SIGMA, seed=5, dtype=torch.float32)
    seeded, refreshed = (build_projector("random", 4, proj_type="right", seed=3, index=2) for _ in range(2))
    assert seeded.refresh_seeded(tuple(g.shape), 0, torch.float32, g.device) and refreshed.refresh(g, 0)
    assert torch.equal(seeded.factors[1], refreshed.factors[1])


@pytest.mark.parametrize("columns", [slice(0, 5), slice(3, 11), slice(None), slice(7, 7), torch.tensor([4, 0, 9, 2])],
                         ids=["top", "middle", "all", "empty", "drawn"])
def test_descending_columns_are_a_cut_of_the_flipped_eigenvectors(columns):
    """Cutting the columns a basis asks for out of eigh's ascending eigenvectors gives the very values and memory layout
    (matmuls round by layout) of the same columns cut from the whole matrix flipped to descending order."""
    generator = torch.Generator().manual_seed(2)
    g = torch.randn(12, 30, generator=generator)
    _, ascending = torch.linalg.eigh(g @ g.T)
    expected = ascending.flip(-1)[:, columns].clone()
    cut = spectrum_module.descending_columns(ascending, columns)
    assert torch.equal(cut, expected) and cut.stride() == expected.stride()
    assert cut.untyped_storage().data_ptr() != ascending.untyped_storage().data_ptr()  # a copy, not a view


def test_descending_columns_refuses_a_strided_slice():
    with pytest.raises(ValueError, match="consecutive columns.*slice\\(0, 8, 2\\)"):
        spectrum_module.descending_columns(torch.eye(8), slice(0, 8, 2))


@pytest.mark.parametrize("batched", [False, True], ids=["one", "batch"])
def test_a_gram64_decomposition_holds_its_vectors_in_the_gradients_dtype(monkeypatch, batched):
    """solver "gram64" solves in float64; a decomposition waiting for its refresh (refresh_batch > 1 prepares a whole
    batch) keeps n² floats of the gradient's dtype, not eigh's float64 vectors, and cuts the very values and layout a
    cut of the float64 vectors, cast, gives."""
    solved = []
    eigh = torch.linalg.eigh

    def recording_eigh(matrix):
        eigenvalues, eigenvectors = eigh(matrix)
        solved.append((eigenvectors.clone(), weakref.ref(eigenvectors)))
        return eigenvalues, eigenvectors

    monkeypatch.setattr(torch.linalg, "eigh", recording_eigh)
    generator = torch.Generator().manual_seed(3)
    grads = torch.randn(3, 10, 24, generator=generator)
    if batched:
        decompositions = spectrum_module.decompose_batch(grads, (0,), "gram64")
        vectors = list(solved[0][0])
    else:
        decompositions = [decompose(grad, (0,), "gram64") for grad in grads]
        vectors = [copy for copy, _ in solved]
    gc.collect()
    assert all(held() is None for _, held in solved)  # eigh's float64 output is not kept alive
    for decomposition, float64 in zip(decompositions, vectors, strict=True):
        for columns in (slice(0, 4), torch.tensor([5, 1])):
            cut = decomposition.factor(0, columns)
            expected = spectrum_module.descending_columns(float64, columns).float()
            assert cut.dtype == torch.float32 and torch.equal(cut, expected) and cut.stride() == expected.stride()
