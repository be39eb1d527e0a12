"""scripts/train_bpe.py trains the very tokenizer file torchrun_main.py would train for the same corpus, and a second
call reuses it."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import train_bpe  # noqa: E402

from galore_plumage.training import parse_config  # noqa: E402
from galore_plumage.training.data import load_texts  # noqa: E402
from galore_plumage.training.tokenizer import corpus_fingerprint  # noqa: E402


def test_the_bpe_lands_where_a_run_on_the_corpus_looks_for_it_and_is_reused(tmp_path, capsys):
    rng = random.Random(0)
    words = "def class return import self value index torch tensor shape".split()
    corpus = tmp_path / "code.jsonl"
    corpus.write_text("".join(json.dumps({"text": " ".join(rng.choice(words) for _ in range(60))}) + "\n"
                              for _ in range(80)))
    data_dir = tmp_path / "data"
    train_bpe.main([str(corpus), "--vocab_size", "300", "--data_dir", str(data_dir)])
    config = parse_config(["--dataset", str(corpus), "--vocab_size", "300", "--data_dir", str(data_dir)])
    expected = data_dir / "tokenizers" / f"bpe300-{corpus_fingerprint(load_texts(config)[0], 300)}.json"
    assert [p.name for p in (data_dir / "tokenizers").iterdir()] == [expected.name]
    written = expected.stat().st_mtime_ns
    train_bpe.main([str(corpus), "--vocab_size", "300", "--data_dir", str(data_dir)])
    assert expected.stat().st_mtime_ns == written  # reused, not trained again
    assert "ready" in capsys.readouterr().out
