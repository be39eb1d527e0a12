"""Which trainable parameters an optimizer projects (the low-rank group) and which it steps as they are (the regular
group), and why: what build_optimizer groups by and prints when verbose."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..projectors import projector_spec


@dataclass(frozen=True)
class Route:
    name: str
    shape: tuple[int, ...]
    low_rank: bool
    reason: str


def route_parameters(model: nn.Module, target_modules, projector: str | None) -> list[Route]:
    """Decide, for every trainable parameter, low-rank or regular, and why."""
    tensors_ok = projector is not None and projector_spec(projector).tensors
    projectable = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d) if tensors_ok else (nn.Linear,)
    routes, seen = [], set()
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:  # a tied weight is routed once, by its first name
                continue
            seen.add(id(param))
            full_name = f"{module_name}.{param_name}" if module_name else param_name
            if projector is None:
                routes.append(Route(full_name, tuple(param.shape), False, "full-rank optimizer"))
            elif param_name != "weight" or not isinstance(module, projectable):
                kind = "bias" if param_name == "bias" else f"{type(module).__name__}.{param_name}"
                routes.append(Route(full_name, tuple(param.shape), False, f"{kind}: not a projectable weight"))
            elif not any(target in module_name for target in target_modules):
                routes.append(Route(full_name, tuple(param.shape), False, f"module matches none of {list(target_modules)}"))
            else:
                routes.append(Route(full_name, tuple(param.shape), True, "low-rank"))
    return routes


def describe_routing(routes: list[Route], rank: int | None = None) -> str:
    low = [r for r in routes if r.low_rank]
    lines = [f"{len(low)} of {len(routes)} trainable tensors low-rank" + (f" (rank {rank})" if low else "")]
    lines += [f"  {'low-rank' if r.low_rank else 'regular ':8s} {r.name} {list(r.shape)}  {r.reason}" for r in routes]
    return "\n".join(lines)
