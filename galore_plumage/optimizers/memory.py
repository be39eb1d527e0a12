"""How much memory an optimizer's state holds: the bytes of every tensor reachable from it, each counted once."""

from __future__ import annotations

import torch


def state_bytes(state) -> tuple[int, int]:
    """(bytes of the storages the tensors keep alive, bytes of the tensors themselves) reachable from `state`.

    Walks dicts, lists, tuples and the attributes of other objects (galore-torch keeps projector objects in its
    state). The two differ when a tensor is a view: a basis sliced out of a full SVD factor keeps all of it alive.
    """
    storages: dict[int, int] = {}
    tensors: dict[tuple[int, int], int] = {}
    seen: set[int] = set()

    def visit(value) -> None:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
            tensors[value.data_ptr(), value.nbytes] = value.nbytes
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)
        elif hasattr(value, "__dict__") and id(value) not in seen:
            seen.add(id(value))
            visit(vars(value))

    visit(state)
    return sum(storages.values()), sum(tensors.values())
