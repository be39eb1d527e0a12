"""The offline tokenizer: a byte-level BPE trained on the training split, deterministic and cached by fingerprint.

Determinism is what makes the cache safe (the same text always gives the same file, whoever trains it),
and the fingerprint is what keeps a changed corpus from reusing a stale tokenizer. Nothing here goes to
the network: the AutoTokenizer path is only exercised in offline mode.
"""

from __future__ import annotations

import random

import huggingface_hub
import pytest

from galore_plumage.training import tokenizer as tokenizer_lib
from galore_plumage.training.tokenizer import EOS, bundled_bpe, corpus_fingerprint, load_tokenizer

VOCAB = 320


def _texts(seed: int = 0, count: int = 60) -> list[str]:
    """Seeded pseudo-English: enough repetition for merges, enough variety for a few hundred of them."""
    words = ["the", "king", "queen", "crown", "sword", "night", "morning", "speak", "lord", "lady", "thou", "art",
             "hath", "doth", "wherefore", "gentle", "noble", "Romeo", "Juliet", "Hamlet", "Denmark", "poison"]
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 30))) + rng.choice(".!?;") for _ in range(count)]


def _trained_files(cache_dir):
    return sorted((cache_dir / "tokenizers").glob("*.json"))


def test_training_is_deterministic(tmp_path):
    """Two trainings on the same text in different folders write byte-identical tokenizer.json files."""
    bundled_bpe(_texts(), VOCAB, tmp_path / "a")
    bundled_bpe(_texts(), VOCAB, tmp_path / "b")
    (first,), (second,) = _trained_files(tmp_path / "a"), _trained_files(tmp_path / "b")
    assert first.name == second.name
    assert first.read_bytes() == second.read_bytes()
    assert not [p for p in (tmp_path / "a" / "tokenizers").iterdir() if p.name.startswith(".")]  # no temp left


def test_cached_by_fingerprint(tmp_path, monkeypatch):
    """The second call reuses the file without training; another text or vocabulary size trains another file."""
    first = bundled_bpe(_texts(), VOCAB, tmp_path)
    (path,) = _trained_files(tmp_path)
    assert path.name == f"bpe{VOCAB}-{corpus_fingerprint(_texts(), VOCAB)}.json"

    def no_training(*args, **kwargs):
        raise AssertionError("the cached tokenizer should have been reused")

    with monkeypatch.context() as patch:
        patch.setattr(tokenizer_lib, "train_bpe", no_training)
        again = bundled_bpe(_texts(), VOCAB, tmp_path)
    assert again.get_vocab() == first.get_vocab()

    changed = _texts()
    changed[7] += " Exit, pursued by a bear."
    bundled_bpe(changed, VOCAB, tmp_path)
    bundled_bpe(_texts(), VOCAB + 16, tmp_path)
    assert len(_trained_files(tmp_path)) == 3
    assert len({corpus_fingerprint(_texts(), VOCAB), corpus_fingerprint(changed, VOCAB),
                corpus_fingerprint(_texts(), VOCAB + 16)}) == 3


def test_fingerprint_sees_document_boundaries():
    """['ab', 'c'] and ['a', 'bc'] are different corpora and must not share a tokenizer."""
    assert corpus_fingerprint(["ab", "c"], VOCAB) != corpus_fingerprint(["a", "bc"], VOCAB)
    assert corpus_fingerprint(["ab", "c"], VOCAB) == corpus_fingerprint(["ab", "c"], VOCAB)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return bundled_bpe(_texts(), VOCAB, tmp_path_factory.mktemp("bpe"))


@pytest.mark.parametrize("text", [
    "the king hath spoken.", "  Leading spaces,\ttabs\nand newlines\n\n", "Words never seen: xylophone 1234 ~!@#$%^&*()",
    "", "a",
])
def test_round_trip(bpe, text):
    """decode(encode(x)) == x for ASCII text, including words and bytes the training text never had."""
    ids = bpe(text, add_special_tokens=False)["input_ids"]
    assert bpe.decode(ids) == text
    assert all(0 <= i < len(bpe) for i in ids)


def test_vocabulary_size_and_compression(bpe):
    """The trained vocabulary has the size asked for, and merges shorten the training text below one id a byte."""
    assert len(bpe) == VOCAB
    text = " ".join(_texts())
    assert len(bpe(text, add_special_tokens=False)["input_ids"]) < len(text.encode()) / 2


def test_has_the_eos_token(bpe):
    """EOS is a single special token with a fixed id, which packing relies on to separate documents."""
    assert bpe.eos_token == EOS
    assert bpe.eos_token_id == bpe.convert_tokens_to_ids(EOS) == 0
    assert bpe(EOS, add_special_tokens=False)["input_ids"] == [bpe.eos_token_id]
    assert bpe("the king", add_special_tokens=False)["input_ids"][-1] != bpe.eos_token_id  # EOS is added by packing


def test_bpe_needs_the_training_text(tmp_path):
    """A streamed dataset has no training split in memory: the error says to use t5-base."""
    with pytest.raises(ValueError, match="pass --tokenizer t5-base"):
        load_tokenizer("bpe", None, VOCAB, tmp_path, 64)


def test_bpe_through_load_tokenizer(tmp_path):
    loaded = load_tokenizer("bpe", _texts(), VOCAB, tmp_path, 64)
    assert loaded.eos_token_id == 0 and len(_trained_files(tmp_path)) == 1


def test_unknown_tokenizer_offline_is_a_value_error(tmp_path, monkeypatch):
    """Offline, an unknown AutoTokenizer name is a ValueError naming it and pointing to --tokenizer bpe."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once at import time
    name = "galore-plumage-tests/no-such-tokenizer"
    with pytest.raises(ValueError, match=f"--tokenizer '{name}' could not be loaded") as error:
        load_tokenizer(name, None, VOCAB, tmp_path, 64)
    assert "--tokenizer bpe" in str(error.value)
