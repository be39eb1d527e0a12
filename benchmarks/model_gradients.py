"""The gradients of one Llama decoder layer's seven weights, taken from a model of that layer's shape on real text.

step_time.py times a refresh on seeded Gaussian gradients by default. Their singular values are flat (a Marchenko–
Pastur spread), the slowest case for the divide-and-conquer eigensolvers and SVDs that a refresh runs: they deflate
little. A model's gradients fall off steeply (docs/results.md §2 measures llama_tiny's), so a refresh on them costs
what a training run's refresh costs. Here: a Llama with the layer's hidden and intermediate sizes, two layers and the
bundled corpus's BPE (8,192 tokens), trained a few AdamW steps on the bundled plays, then one more batch's gradients
of its last layer, in the order of step_time.layer_shapes (q, k, v, o, gate, up, down). Seeded: the same tensors
every run.

Needs the bundled corpus (`make data`); the tokenizer is trained on it if no cached one is found (a few seconds).
"""

from __future__ import annotations

from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 8192
LAYERS = 2
WARM_STEPS = 4  # AdamW steps before the gradients are taken: past the first step's, which is the init's alone
BATCH, LENGTH = 16, 256  # 4,096 tokens: a batch whose gradient is not rank-limited by its tokens


def layer_gradients(h: int, i: int, device: torch.device, seed: int = 0,
                    data_dir: Path = ROOT / "data") -> list[torch.Tensor]:
    """The float32 gradients of the last decoder layer's q, k, v, o, gate, up and down weights (see the module's
    docstring), on `device`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    sequences = _token_batches(data_dir, WARM_STEPS + 1)
    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=h, intermediate_size=i, num_hidden_layers=LAYERS, num_attention_heads=h // 64,
                         num_key_value_heads=h // 64, vocab_size=VOCAB, max_position_embeddings=LENGTH)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for batch in sequences[:-1]:
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model(input_ids=sequences[-1], labels=sequences[-1]).loss.backward()
    layer = model.model.layers[-1]
    weights = [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
               layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj]
    return [w.weight.grad.detach().to(device=device, dtype=torch.float32).contiguous() for w in weights]


def _token_batches(data_dir: Path, count: int) -> list[torch.Tensor]:
    """`count` batches of BATCH × LENGTH tokens, consecutive from the start of the bundled training works."""
    from galore_plumage.training.corpus import split_works
    from galore_plumage.training.tokenizer import bundled_bpe

    corpus = data_dir / "shakespeare"
    if not corpus.is_dir():
        raise FileNotFoundError(f"no bundled corpus at {corpus}: run `make data` first (or pass --gradients gaussian)")
    train, _ = split_works(corpus)
    texts = [path.read_text(encoding="utf-8") for path in train]
    tokenizer = bundled_bpe(texts, VOCAB, data_dir)  # cached under data/tokenizers
    needed = count * BATCH * LENGTH
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text)["input_ids"])
        if len(ids) >= needed:
            break
    return list(torch.tensor(ids[:needed]).view(count, BATCH, LENGTH))
