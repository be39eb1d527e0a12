"""build_optimizer's routing on a small Llama-shaped model: which weights are projected, and why the rest are not."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from train_helpers import SHORT_RUN, SMALL_BATCH

from galore_plumage import build_optimizer
from galore_plumage.optimizers import PLUMAGE_ADAFACTOR_DRAWS, LayerwiseOptimizer, describe_routing
from galore_plumage.optimizers.options import OPTIONS


class RMSNorm(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))


class Attention(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(width, width, bias=False), nn.Linear(width, width, bias=False)
        self.v_proj, self.o_proj = nn.Linear(width, width, bias=False), nn.Linear(width, width, bias=False)


class MLP(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(width, 2 * width, bias=False), nn.Linear(width, 2 * width, bias=False)
        self.down_proj = nn.Linear(2 * width, width, bias=True)  # one bias, to see it routed as one


class Layer(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.self_attn, self.mlp = Attention(width), MLP(width)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(width), RMSNorm(width)


class TinyLlama(nn.Module):
    def __init__(self, vocab=50, width=16, layers=2):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(Layer(width) for _ in range(layers))
        self.norm = RMSNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)


def _model(freeze=True):
    torch.manual_seed(0)
    model = TinyLlama()
    if freeze:
        model.layers[1].self_attn.v_proj.weight.requires_grad_(False)  # e.g. a frozen adapter base
        model.embed_tokens.weight.requires_grad_(False)
    return model


def _expected_low_rank(model):
    return {
        f"{name}.weight" for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and ("self_attn" in name or "mlp" in name) and module.weight.requires_grad
    }


@pytest.mark.parametrize("name", ["plumage_adamw", "galore_adamw8bit", "flora_sgdm", "galore_adafactor_per_layer"])
def test_exactly_the_attention_and_mlp_weights_are_low_rank(name):
    model = _model()
    optimizer = build_optimizer(name, model, rank=4, **({"lr": None} if "adafactor" in name else {"lr": 1e-3}))
    names = {id(p): n for n, p in model.named_parameters()}
    low = {names[id(p)] for g in optimizer.param_groups if "rank" in g for p in g["params"]}
    assert low == _expected_low_rank(model)
    assert len(low) == 2 * 7 - 1  # 7 projections per layer, one frozen

    grouped = [id(p) for g in optimizer.param_groups for p in g["params"]]
    trainable = [id(p) for p in model.parameters() if p.requires_grad]
    assert sorted(grouped) == sorted(trainable)  # every trainable tensor exactly once, nothing frozen
    assert len(grouped) == len(set(grouped))
    if name.endswith("_per_layer"):
        assert isinstance(optimizer, LayerwiseOptimizer)
        optimizer.remove_hooks()


def test_routing_reasons():
    model = _model()
    optimizer = build_optimizer("plumage_adamw", model, rank=4, lr=1e-3)
    routes = {r.name: r for r in optimizer.routing}
    assert set(routes) == {n for n, p in model.named_parameters() if p.requires_grad}
    assert "embed_tokens.weight" not in routes and "layers.1.self_attn.v_proj.weight" not in routes  # frozen
    assert routes["layers.0.self_attn.q_proj.weight"].low_rank and routes["layers.0.self_attn.q_proj.weight"].reason == "low-rank"
    assert routes["layers.0.mlp.down_proj.weight"].shape == (16, 32)
    assert routes["layers.0.mlp.down_proj.bias"].reason == "bias: not a projectable weight"
    assert routes["layers.0.input_layernorm.weight"].reason == "RMSNorm.weight: not a projectable weight"
    assert routes["norm.weight"].reason == "RMSNorm.weight: not a projectable weight"
    assert routes["lm_head.weight"].reason == "module matches none of ['attn', 'mlp']"
    assert all(r.reason for r in routes.values())


def test_routing_embedding_reason():
    model = _model(freeze=False)
    routes = {r.name: r for r in build_optimizer("plumage_adamw", model, rank=4, lr=1e-3).routing}
    assert not routes["embed_tokens.weight"].low_rank
    assert routes["embed_tokens.weight"].reason == "Embedding.weight: not a projectable weight"


def test_target_modules_choose_the_low_rank_weights():
    model = _model()
    optimizer = build_optimizer("plumage_adamw", model, rank=4, lr=1e-3, target_modules=("mlp",))
    low = {r.name for r in optimizer.routing if r.low_rank}
    assert low == {n for n in _expected_low_rank(model) if ".mlp." in n}


def test_verbose_prints_the_routing(capsys):
    model = _model()
    optimizer = build_optimizer("plumage_adamw", model, rank=4, lr=1e-3, verbose=True)
    printed = capsys.readouterr().out
    assert printed.strip() == describe_routing(optimizer.routing, 4).strip()
    total = sum(p.requires_grad for p in model.parameters())
    assert printed.startswith(f"13 of {total} trainable tensors low-rank (rank 4)")
    assert "lm_head.weight" in printed and "module matches none of" in printed
    assert "layers.0.self_attn.q_proj.weight [16, 16]" in printed


def test_full_rank_name_routes_everything_regular():
    model = _model()
    optimizer = build_optimizer("adamw", model, lr=1e-3)
    assert all("rank" not in g for g in optimizer.param_groups)
    assert {r.reason for r in optimizer.routing} == {"full-rank optimizer"}
    assert describe_routing(optimizer.routing).startswith("0 of ")


def test_projector_override():
    model = _model()
    optimizer = build_optimizer("galore_adamw", model, rank=4, lr=1e-3, projector="plumage", realign="m")
    (group,) = [g for g in optimizer.param_groups if "rank" in g]
    assert group["projector"] == "plumage" and group["realign"] == "m"
    assert group["scale"] == 0.25  # scale follows the name's family (GaLore's recipe), not the projector
    default = next(g for g in build_optimizer("galore_adamw", _model(), rank=4).param_groups if "rank" in g)
    assert (default["projector"], default["realign"], default["scale"]) == ("svd", "none", 0.25)
    plumage = next(g for g in build_optimizer("plumage_adamw", _model(), rank=4).param_groups if "rank" in g)
    # the fair protocols' choice for Adam moments since session 17: GaLore's recipe on GaLore's top-r basis, with the
    # floor V ← max(V, M²) before each low-rank update, no complement, moments kept at a refresh
    assert (plumage["projector"], plumage["realign"], plumage["scale"]) == ("svd", "none", 0.25)
    assert (plumage["lr"], plumage["v_floor"], plumage["residual"]) == (1e-2, "m2", "none")
    # PLUMAGE's projector by name takes the family's sampling defaults: Adam's step on every drawn row with no 1/p
    # rescaling, the rows drawn anew before every update from a bfloat16 pool
    drawn = next(g for g in build_optimizer("plumage_adamw", _model(), rank=4, projector="plumage").param_groups
                 if "rank" in g)
    assert (drawn["projector"], drawn["sampled_step"], drawn["max_inv_p"], drawn["resample_every"]) == (
        "plumage", "adaptive", 1.0, 1)
    assert drawn["pool_bf16"] is True
    sgdm = next(g for g in build_optimizer("plumage_sgdm", _model(), rank=4).param_groups if "rank" in g)
    # the draws as plumage_adafactor's, at GaLore's scale (session 46: the paper's step trained erratically under SGD)
    assert (sgdm["scale"], sgdm["sampled_step"], sgdm["max_inv_p"], sgdm["resample_every"], sgdm["realign"]) == (
        0.25, "adaptive", 1.0, 1, "mv")
    # plumage_adafactor's draws of sessions 42-80, one dict away: the same options as plumage_sgdm's
    drawn = next(g for g in build_optimizer("plumage_adafactor", _model(), rank=4, **PLUMAGE_ADAFACTOR_DRAWS).param_groups
                 if "rank" in g)
    assert {o.key: sgdm[o.key] for o in OPTIONS} == {o.key: drawn[o.key] for o in OPTIONS}
    # its default since session 81: GaLore's recipe on GaLore's top-r basis (refreshed through the Gram), no complement
    adafactor = next(g for g in build_optimizer("plumage_adafactor", _model(), rank=4).param_groups if "rank" in g)
    assert (adafactor["projector"], adafactor["realign"], adafactor["scale"]) == ("svd", "none", 0.25)
    assert (adafactor["solver"], adafactor["residual"]) == ("auto", "none")


def test_tucker_override_projects_convolutions():
    model = nn.ModuleDict({"attn": nn.Linear(8, 8), "mlp": nn.Conv2d(4, 6, 3)})
    optimizer = build_optimizer("galore_adamw", model, rank=2, lr=1e-3, projector="tucker")
    assert {r.name for r in optimizer.routing if r.low_rank} == {"attn.weight", "mlp.weight"}
    plain = build_optimizer("galore_adamw", model, rank=2, lr=1e-3)
    assert {r.name for r in plain.routing if r.low_rank} == {"attn.weight"}  # svd takes 2-D weights only


def test_full_rank_name_with_projector_raises():
    with pytest.raises(ValueError, match="optimizer 'adamw' is full-rank.*projector='svd'"):
        build_optimizer("adamw", _model(), projector="svd")
    with pytest.raises(ValueError, match="optimizer 'sgd' is full-rank"):
        build_optimizer("sgd", _model(), projector="plumage")


def test_tied_weights_are_routed_once():
    """A weight shared by two modules (tied embeddings) is one parameter: one route, one group, by its first name."""
    model = _model(freeze=False)
    model.lm_head.weight = model.embed_tokens.weight
    model.layers[1].mlp.up_proj.weight = model.layers[0].mlp.up_proj.weight
    optimizer = build_optimizer("plumage_adamw", model, rank=4, lr=1e-3)
    routed = [r.name for r in optimizer.routing]
    assert sorted(routed) == sorted(n for n, _ in model.named_parameters())
    assert "lm_head.weight" not in routed and "layers.1.mlp.up_proj.weight" not in routed
    grouped = [id(p) for g in optimizer.param_groups for p in g["params"]]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters())
    low = {r.name for r in optimizer.routing if r.low_rank}
    assert "layers.0.mlp.up_proj.weight" in low and "embed_tokens.weight" not in low


def test_the_callers_groups_are_left_as_given():
    """The README's drop-in: one list of groups builds GaLoreAdamW, then PlumageAdamW with its own defaults."""
    from galore_plumage import GaLoreAdamW, PlumageAdamW

    model = _model()
    weights = [p for p in model.parameters() if p.dim() == 2]
    others = [p for p in model.parameters() if p.dim() != 2]
    groups = [{"params": others}, {"params": weights, "rank": 4, "update_proj_gap": 10, "proj_type": "std"}]
    given = [dict(group) for group in groups]
    GaLoreAdamW(groups, lr=1e-2)
    assert groups == given  # no key filled in, none changed
    plumage = PlumageAdamW(groups)
    low_rank = next(g for g in plumage.param_groups if "rank" in g)
    assert (low_rank["projector"], low_rank["lr"], low_rank["scale"], low_rank["v_floor"]) == ("svd", 1e-2, 0.25, "m2")
    assert low_rank["params"] == weights and groups == given


@pytest.mark.parametrize("name", ["galore_adamw", "plumage_adamw", "plumage_adamw_per_layer", "galore_adafactor"])
def test_regular_lr_is_the_regular_groups_and_follows_the_schedule(name):
    """--regular_lr: the regular group (embeddings, norms, head) at its own peak lr, the low-rank one at `lr`; a
    schedule scales both alike, and the same gradient moves a regular weight by that group's lr."""
    from galore_plumage.training.schedule import build_scheduler, step_scheduler

    model = _model(freeze=False)
    optimizer = build_optimizer(name, model, rank=4, lr=1e-2, regular_lr=2e-3)
    inner = optimizer.optimizer if isinstance(optimizer, LayerwiseOptimizer) else optimizer
    regular, low_rank = inner.param_groups
    assert "rank" not in regular and "rank" in low_rank
    assert (regular["lr"], low_rank["lr"]) == (2e-3, 1e-2)
    assert {id(p) for p in regular["params"]} == {id(model.lm_head.weight), id(model.embed_tokens.weight),
                                                   id(model.norm.weight),
                                                   *(id(p) for layer in model.layers for p in (
                                                       layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                                                       layer.mlp.down_proj.bias))}
    scheduler = build_scheduler(inner, "cosine", warmup_steps=2, total_steps=10, min_lr_ratio=0.1)
    for _ in range(5):
        for param in model.parameters():
            param.grad = torch.ones_like(param)
        optimizer.step()
        step_scheduler(scheduler)  # quiet about per-layer mode, whose weights step in their hooks
        assert regular["lr"] == pytest.approx(0.2 * low_rank["lr"], rel=1e-12)
    assert 0 < low_rank["lr"] < 1e-2


def test_regular_lr_moves_the_regular_weights_by_its_own_lr():
    """AdamW's first step moves a weight by lr (its normalized step is ±1): the head by regular_lr, not lr."""
    moved = []
    for regular_lr in (None, 1e-3):
        model = _model(freeze=False)
        optimizer = build_optimizer("galore_adamw", model, rank=4, lr=1e-2, regular_lr=regular_lr)
        before = model.lm_head.weight.detach().clone()
        for param in model.parameters():
            param.grad = torch.ones_like(param)
        optimizer.step()
        moved.append((model.lm_head.weight.detach() - before).abs().max().item())
    assert moved == [pytest.approx(1e-2, rel=1e-3), pytest.approx(1e-3, rel=1e-3)]


def test_regular_lr_is_a_rescaled_galore_scale_without_weight_decay():
    """Adam's low-rank step is lr x scale x its normalized direction, and the decay is lr x weight_decay: so with no
    decay, --lr L --regular_lr R is the run --lr R --galore_scale s L / R (why the protocol's arms with regular_lr
    also measure GaLore's scale). Across refreshes, with the floor, to float32 rounding."""
    weights = []
    for options in ({"lr": 5e-3, "regular_lr": 2e-2, "scale": 0.25}, {"lr": 2e-2, "scale": 0.25 * 5e-3 / 2e-2}):
        model = _model(freeze=False)
        optimizer = build_optimizer("galore_adamw", model, rank=4, update_proj_gap=2, v_floor="m2", **options)
        generator = torch.Generator().manual_seed(0)
        for _ in range(5):
            for param in model.parameters():
                param.grad = torch.randn(param.shape, generator=generator)
            optimizer.step()
        weights.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*weights, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert not torch.equal(weights[0][0], _model(freeze=False).embed_tokens.weight)


@pytest.mark.parametrize(("name", "regular_lr", "message"), [
    ("adamw", 1e-3, r"regular_lr=0.001 .* optimizer 'adamw' projects none; give its lr as lr"),
    ("galore_adamw", 0.0, r"regular_lr=0.0: expected a positive finite number"),
    ("galore_adamw", float("nan"), r"regular_lr=nan: expected a positive finite number"),
    ("plumage_adamw", -1e-3, r"regular_lr=-0.001: expected a positive finite number"),
])
def test_regular_lr_bad_values_are_refused(name, regular_lr, message):
    with pytest.raises(ValueError, match=message):
        build_optimizer(name, _model(), rank=4, regular_lr=regular_lr)


@pytest.mark.parametrize("name", ["adafactor", "galore_adafactor", "plumage_adafactor"])
def test_adafactor_names_take_a_given_lr(name):
    """An lr replaces Adafactor's relative step (it used to fail: "Cannot combine manual lr and relative_step"), and
    the step then follows that lr: the same gradient moves the weights 10x farther at 10x the lr."""
    moved = []
    for lr in (1e-4, 1e-3):
        model = _model()
        optimizer = build_optimizer(name, model, rank=4, lr=lr)
        assert all(g["lr"] == lr and g["relative_step"] is False and g["scale_parameter"] is False
                   for g in optimizer.param_groups)
        before = model.lm_head.weight.detach().clone()
        model.lm_head.weight.grad = torch.ones_like(before)
        optimizer.step()
        moved.append((model.lm_head.weight.detach() - before).abs().max().item())
    assert moved[0] > 0 and moved[1] == pytest.approx(10 * moved[0], rel=1e-4)


def test_adafactor_keeps_its_relative_step_without_an_lr_and_refuses_both():
    model = _model()
    optimizer = build_optimizer("galore_adafactor", model, rank=4)
    assert all(g["lr"] is None and g["relative_step"] is True for g in optimizer.param_groups)
    with pytest.raises(ValueError, match="Cannot combine manual lr=0.001 and relative_step=True"):
        build_optimizer("galore_adafactor", _model(), rank=4, lr=1e-3, relative_step=True)


def test_the_plumage_adamw_default_is_the_protocols_galore_plus_floor_arm():
    """benchmarks/pretrain_protocol.py measures the default as `galore_adamw --galore_scale 0.25 --v_floor m2 --solver
    gram` (arm galore_recipe_vfloor_gram): the two must be the same run, bit for bit, across refreshes (the plumage
    family's PLUMAGE-only defaults stay inert)."""
    weights = []
    for name, options in (("plumage_adamw", {}), ("galore_adamw", {"v_floor": "m2", "solver": "gram", "lr": 1e-2})):
        model = _model()
        optimizer = build_optimizer(name, model, rank=4, update_proj_gap=2, **options)
        generator = torch.Generator().manual_seed(0)
        for _ in range(5):  # refreshes at updates 1, 3, 5
            for param in model.parameters():
                if param.requires_grad:
                    param.grad = torch.randn(param.shape, generator=generator)
            optimizer.step()
        weights.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*weights, strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(weights[0], [p for p in _model().parameters()], strict=True))


@pytest.mark.parametrize("shape, lr", [
    ([], 2e-2),  # 8 x 256 = 2048 tokens an update: m2's own warm-up at twice the library's lr (session 56)
    (SMALL_BATCH, 1e-2),  # 512 tokens: the library's lr (session 53)
])  # SHORT_RUN: below PRETRAIN_LONG_RUN_LR's 1000 updates
def test_the_pretraining_default_is_the_protocols_ratio2_arm(shape, lr):
    """torchrun_main.py gives plumage_adamw's regular group 2x its lr (session 33): its command line and the protocol's
    arm galore_recipe_vfloor_gram_ratio2 (galore_adamw ... --v_floor m2 --regular_lr_ratio 2, at 2e-2 from 2048 tokens
    an update, optimizers.PRETRAIN_LR, and 1e-2 below) build the same groups, lrs, scale and floor; the test above
    shows that the rest (the solver 'auto' resolves to) takes the same steps."""
    from galore_plumage.training.config import parse_config
    from galore_plumage.training.loop import make_optimizer

    groups = []
    for argv in (["--optimizer", "plumage_adamw"], ["--optimizer", "galore_adamw", "--galore_scale", "0.25", "--v_floor",
                                                     "m2", "--solver", "gram", "--lr", f"{lr:g}",
                                                     "--regular_lr_ratio", "2"]):
        optimizer = make_optimizer(parse_config(["--rank", "4", *SHORT_RUN, *shape, *argv]), _model())
        groups.append([(len(g["params"]), g["lr"], g.get("rank"), g["scale"],
                        *((g["v_floor"], g["v_floor_horizon"]) if "rank" in g else ()))  # a floor acts on low rank only
                       for g in optimizer.param_groups])
    assert groups[0] == groups[1]
    assert groups[0][1][-2:] == ("m2", None)
    assert [lr for _, lr, *_ in groups[0]] == [2 * lr, lr]  # the regular group first, at 2x
