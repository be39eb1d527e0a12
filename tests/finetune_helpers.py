"""Shared by the fine-tuning tests: a tiny random BERT saved like a hub model, and a synthetic two-play corpus."""

from __future__ import annotations

import json
import random
from pathlib import Path

from galore_plumage.finetune.tasks import PLAYS

WORDS = {  # each play draws from its own words, so the task is learnable and the labels are known
    PLAYS[0]: "blood dagger night witch king thane crown murder sleep castle".split(),
    PLAYS[1]: "fairy wood lover moon dream queen flower ass wall lion".split(),
}
COMMON = "the and of to my is that with".split()


def write_plays(data_dir: Path, lines_per_play: int = 2000, seed: int = 0) -> Path:
    """data_dir/shakespeare/ holding two Gutenberg-style plays (title, cast, ACT/SCENE headings, speaker tags,
    stage directions) of `lines_per_play` spoken lines each, marked complete so nothing is downloaded."""
    rng = random.Random(seed)
    folder = Path(data_dir) / "shakespeare"
    folder.mkdir(parents=True, exist_ok=True)
    for play, words in WORDS.items():
        out = [play.upper(), "", "Persons Represented", "", "KING, a king.", "", "SCENE: somewhere far away.", "",
               "ACT I.", "", "SCENE I. A heath.", "", "[Enter two players.]", ""]
        for i in range(lines_per_play):
            if i % 5 == 0:
                out += ["", "FIRST PLAYER." if i % 2 else "SECOND PLAYER."]
            out.append(" ".join(rng.choice(words + COMMON) for _ in range(rng.randint(6, 10))))
        (folder / f"{play}_gut.txt").write_text("\n".join(out) + "\n", encoding="utf-8")
    (folder / ".complete").write_text("2 works\n")
    return folder


def save_tiny_bert(folder: Path, seed: int = 0, dropout: float = 0.1) -> Path:
    """A 2-layer, 32-wide BERT with random weights and a word-level vocabulary, saved with save_pretrained (dropout:
    BERT's default 0.1; 0 for runs that must match batch for batch)."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted({w for ws in WORDS.values() for w in ws} | set(COMMON))
    BertTokenizerFast(vocab={word: i for i, word in enumerate(vocab)}).save_pretrained(folder)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout)
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(folder)  # an encoder with its pooler and no classification head, as MiniLM
    return folder


def records(out: Path, kind: str) -> list[dict]:
    """The records of one type in a run's metrics.jsonl, in order."""
    return [r for r in map(json.loads, (Path(out) / "metrics.jsonl").read_text().splitlines()) if r["type"] == kind]
