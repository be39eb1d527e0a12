"""Tokenizers: the offline default (a byte-level BPE trained on the training split) or any AutoTokenizer.

The BPE is cached under a name that hashes its training text and vocabulary size, so a changed corpus
can never reuse a stale tokenizer, and the same corpus always gives the same file (training is
deterministic).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

EOS = "<|endoftext|>"


def corpus_fingerprint(texts: Sequence[str], vocab_size: int) -> str:
    digest = hashlib.sha256(f"bpe-{vocab_size}".encode())
    for text in texts:
        digest.update(hashlib.sha256(text.encode()).digest())
    return digest.hexdigest()[:16]


def train_bpe(texts: Sequence[str], vocab_size: int, path: Path) -> None:
    """Train a byte-level BPE with one special token (EOS) and write it to `path` atomically."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tokenizer.save(str(temp))
    os.replace(temp, path)


def bundled_bpe(texts: Sequence[str], vocab_size: int, cache_dir: Path) -> PreTrainedTokenizerFast:
    path = Path(cache_dir) / "tokenizers" / f"bpe{vocab_size}-{corpus_fingerprint(texts, vocab_size)}.json"
    if not path.exists():
        train_bpe(texts, vocab_size, path)
    return PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token=EOS)


def load_tokenizer(name: str, train_texts: Sequence[str] | None, vocab_size: int, cache_dir: Path,
                   max_length: int) -> PreTrainedTokenizerBase:
    """`name` 'bpe' trains (or reuses) the offline BPE on `train_texts`; anything else goes to AutoTokenizer."""
    if name == "bpe":
        if train_texts is None:
            raise ValueError("--tokenizer bpe is trained on the training split, which a streamed dataset does not "
                             "hold in memory; pass --tokenizer t5-base (GaLore's choice for C4) or a local tokenizer path")
        return bundled_bpe(train_texts, vocab_size, cache_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, model_max_length=max_length)
    except OSError as error:
        raise ValueError(f"--tokenizer {name!r} could not be loaded ({error}). Offline, use the default "
                         "--tokenizer bpe or a local tokenizer folder") from None
    if tokenizer.eos_token_id is None:
        raise ValueError(f"--tokenizer {name!r} has no EOS token, which packing needs to separate documents")
    return tokenizer
