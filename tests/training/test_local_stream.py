"""--streaming: a local .txt/.jsonl read a line at a time through the streamed path (galore_plumage/training/
local_stream.py), with the in-memory path's documents and validation split, epochs reshuffled, and exact resume."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
import torch
from train_helpers import DIST_VARS, read_metrics, tiny_run_flags, write_corpus

import torchrun_main
from galore_plumage.training import parse_config
from galore_plumage.training.config import TrainConfig, resume_conflicts
from galore_plumage.training.data import Batches, StreamedBatches, load_texts, packed_stream
from galore_plumage.training.distributed import Dist
from galore_plumage.training.documents import iter_documents
from galore_plumage.training.local_stream import bpe_sample, stream_local_file

EOS = 0


class WordTokenizer:
    """Token ids are the integers written in the text; EOS is 0 (never written)."""

    eos_token_id = EOS

    def __call__(self, batch, add_special_tokens=False):
        return {"input_ids": [[int(word) for word in text.split()] for text in batch]}


def numbered_corpus(path: Path, count: int, seed: int = 0) -> list[str]:
    """`count` documents whose tokens name them (document d: 1000·(d+1) + j), one a line of a .jsonl file."""
    rng = random.Random(seed)
    documents = [" ".join(str(1000 * (d + 1) + j) for j in range(rng.randint(1, 9))) for d in range(count)]
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    return documents


def one_process() -> Dist:
    return Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


# ----------------------------------------------------------------- the documents
def test_reading_a_line_at_a_time_splits_as_the_whole_text_would(tmp_path):
    """iter_documents reads .txt a line at a time; its documents are those of splitting the whole text on blank lines
    and stripping each (what read_documents did before it streamed), on 300 random texts of spaces, tabs and breaks."""
    rng = random.Random(0)
    path = tmp_path / "random.txt"
    for _ in range(300):
        text = "".join(rng.choice(["a", "b", " ", "\t", "\n", "\n\n", "\r\n"]) for _ in range(rng.randint(0, 40)))
        path.write_bytes(text.encode())
        whole = path.read_text(encoding="utf-8")  # universal newlines, as the old reader
        expected = [d for d in (block.strip() for block in whole.split("\n\n")) if d]
        assert list(iter_documents(path)) == expected, repr(text)


def test_the_streamed_parts_are_the_in_memory_split(tmp_path):
    """Train and validation of a streamed file are load_texts' (every 20th document held out), in file order."""
    path = write_corpus(tmp_path / "corpus.txt", documents=45)
    train, validation = load_texts(TrainConfig(dataset=str(path)))
    assert len(validation) == 2
    assert [row["text"] for row in stream_local_file(path, "train")] == train
    assert [row["text"] for row in stream_local_file(path, "validation")] == validation
    with pytest.raises(ValueError, match="part 'test'"):
        stream_local_file(path, "test")


def test_the_bpe_sample_is_the_head_of_the_training_split(tmp_path):
    path = write_corpus(tmp_path / "corpus.txt", documents=45)
    train, _ = load_texts(TrainConfig(dataset=str(path)))
    assert bpe_sample(path, chars=10**9) == train
    head = bpe_sample(path, chars=1000)
    assert head == train[: len(head)] and 0 < sum(map(len, head)) <= 1000 < sum(map(len, train[: len(head) + 1]))
    assert bpe_sample(path, chars=1) == train[:1]  # never empty


# ----------------------------------------------------------------- epochs
def test_each_epoch_is_a_new_shuffle_of_the_training_documents(tmp_path):
    """Epoch e reads every training document once, in an order set by seed + e: the same again for the same e."""
    path = tmp_path / "corpus.jsonl"
    documents = numbered_corpus(path, 60)
    train = [d for i, d in enumerate(documents) if i % 20 != 19]
    stream = StreamedBatches(stream_local_file(path, "train"), WordTokenizer(), 4, 2, epoch_seed=7)
    epochs = [list(stream._epoch(e, 0, 1)) for e in (0, 1, 0)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == sorted(train)
    assert epochs[0] != epochs[1] and epochs[0] == epochs[2] and epochs[0] != train


def test_a_streamed_file_is_read_again_at_its_end(tmp_path):
    """The batches run on past the first epoch (a hub stream would end), packing across its boundary."""
    path = tmp_path / "corpus.jsonl"
    documents = numbered_corpus(path, 40)
    stream = StreamedBatches(stream_local_file(path, "train"), WordTokenizer(), 5, 2, epoch_seed=0)
    tokens_per_epoch = sum(len(d.split()) + 1 for i, d in enumerate(documents) if i % 20 != 19)
    batches = list(itertools.islice(stream, 3 * tokens_per_epoch // 10))
    expected = [b.tolist() for b in packed_stream(itertools.chain(stream._epoch(0, 0, 1), stream._epoch(1, 0, 1),
                                                                 stream._epoch(2, 0, 1)), WordTokenizer(), 5, 2)]
    assert [b.tolist() for b in batches] == expected[: len(batches)]


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_skips_to_the_same_batch_in_any_epoch(tmp_path, monkeypatch, workers):
    """skip=k gives the batches after the first k of an uninterrupted read, for k in the first epoch and past it,
    in process and through 2 DataLoader workers."""
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    path = tmp_path / "corpus.jsonl"
    numbered_corpus(path, 40)

    def batches(skip: int, count: int) -> list[list]:
        stream = StreamedBatches(stream_local_file(path, "train"), WordTokenizer(), 5, 2, skip=skip, epoch_seed=3)
        loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=workers) if workers else stream
        return [b.tolist() for b in itertools.islice(loader, count)]

    full = batches(0, 40)  # an epoch is ~20 batches of 10 tokens here (~190 tokens), so 40 cross into epoch 2
    for skip in (1, 7, 23, 31):
        assert batches(skip, 40 - skip) == full[skip:], f"skip={skip}"


def test_an_empty_share_is_an_error_not_an_endless_loop(tmp_path):
    path = tmp_path / "corpus.jsonl"
    numbered_corpus(path, 20)  # 19 training documents
    stream = StreamedBatches(stream_local_file(path, "train"), WordTokenizer(), 5, 2, rank=0, world_size=40,
                             epoch_seed=0)
    stream.rank = 39  # reader 39 of 40: one document each for readers 0..18, none for it
    with pytest.raises(ValueError, match="no training document for reader 39 of 40"):
        next(iter(stream))


# ----------------------------------------------------------------- Batches and the run
def test_streaming_validates_on_the_in_memory_batches(tmp_path):
    """A corpus under 20 MB streams with the same BPE (its sample is the whole training split) and the same
    validation batches as the in-memory path."""
    path = write_corpus(tmp_path / "corpus.txt", documents=200)
    flags = ["--dataset", str(path), "--vocab_size", "256", "--max_length", "32", "--batch_size", "2",
             "--eval_tokens", "512", "--data_dir", str(tmp_path / "data"), "--workers", "0"]
    in_memory = Batches(parse_config(flags), one_process())
    streamed = Batches(parse_config([*flags, "--streaming"]), one_process())
    assert streamed.streamed and not in_memory.streamed
    assert streamed.tokenizer.get_vocab() == in_memory.tokenizer.get_vocab()
    assert len(list((tmp_path / "data" / "tokenizers").glob("*.json"))) == 1  # one BPE, found again
    assert len(streamed.validation) == len(in_memory.validation) == 8
    for a, b in zip(streamed.validation, in_memory.validation, strict=True):
        assert torch.equal(a, b)
    first = streamed.next()
    assert first.shape == (2, 32) and streamed.state_dict() == {"position": 1}


def test_too_few_documents_to_validate_is_refused(tmp_path):
    path = write_corpus(tmp_path / "corpus.txt", documents=15)
    config = parse_config(["--dataset", str(path), "--vocab_size", "256", "--max_length", "32", "--streaming",
                           "--data_dir", str(tmp_path / "data")])
    with pytest.raises(ValueError, match="validation split fills no micro-batch .* at least 20 documents"):
        Batches(config, one_process())


def test_a_hub_stream_that_ends_says_so(tmp_path, monkeypatch):
    """A hub stream is read once: at its end the run stops with what to change, not a bare StopIteration."""
    import galore_plumage.training.data as data

    path = tmp_path / "corpus.jsonl"
    numbered_corpus(path, 40)
    monkeypatch.setattr(data, "stream_hub_dataset", lambda name, split, seed: stream_local_file(path, split))
    monkeypatch.setattr(data, "load_tokenizer", lambda *args: WordTokenizer())
    batches = Batches(parse_config(["--dataset", "some/hub-set", "--tokenizer", "t5-base", "--max_length", "5",
                                    "--batch_size", "2", "--workers", "0", "--eval_tokens", "10"]), one_process())
    with pytest.raises(RuntimeError, match=r"'some/hub-set' ran out after \d+ micro-batches on rank 0; train for fewer"):
        for _ in range(1000):
            batches.next()


def test_streaming_the_bundled_corpus_is_refused():
    with pytest.raises(ValueError, match="--streaming reads a local .txt/.jsonl"):
        parse_config(["--streaming"])


def test_a_resume_may_not_change_streaming(tmp_path):
    path = write_corpus(tmp_path / "corpus.txt", documents=45)
    saved = vars(parse_config(["--dataset", str(path), "--streaming"]))
    assert resume_conflicts(saved, parse_config(["--dataset", str(path)])) != []
    assert resume_conflicts(saved, parse_config(["--dataset", str(path), "--streaming"])) == []


def short_training_corpus(path: Path) -> Path:
    """40 documents: the 38 trained on of 4 words each (~600 tokens in all, fewer than 6 updates of 2 x 2 x 32 take),
    the 2 held out of 100 (enough to validate on)."""
    rng = random.Random(1)
    words = ["".join(rng.choice("abcdefgh") for _ in range(4)) for _ in range(50)]
    documents = [" ".join(rng.choice(words) for _ in range(100 if i % 20 == 19 else 4)) for i in range(40)]
    path.write_text("\n\n".join(documents) + "\n")
    return path


def test_a_streamed_run_stops_and_resumes_bit_for_bit(tmp_path, monkeypatch, capsys):
    """torchrun_main.py --streaming: 6 updates straight against 3, a stop, and 3 more from the checkpoint, the run
    reading the file past its end; the checkpoint refuses a resume that reads the file in memory."""
    from transformers import AutoTokenizer

    for var in DIST_VARS:
        monkeypatch.delenv(var, raising=False)
    path = short_training_corpus(tmp_path / "corpus.txt")
    flags = [*tiny_run_flags(tmp_path, path, 6), "--workers", "0", "--optimizer", "plumage_adamw", "--batch_size", "2",
             "--gradient_accumulation", "2", "--save_every", "3"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert torchrun_main.main([*flags, "--streaming", "--save_dir", str(straight)]) == 0
    assert torchrun_main.main([*flags, "--streaming", "--save_dir", str(resumed), "--stop_at", "3"]) == 0
    assert torchrun_main.main([*flags, "--streaming", "--save_dir", str(resumed), "--continue_from", str(resumed)]) == 0
    a, b = read_metrics(straight), read_metrics(resumed)
    assert [r["step"] for r in b["train"]] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in b["train"]] == [r["loss"] for r in a["train"]]
    assert b["summary"][0]["eval_loss"] == a["summary"][0]["eval_loss"]
    tokenizer = AutoTokenizer.from_pretrained(straight / "model_6")
    train, _ = load_texts(TrainConfig(dataset=str(path)))
    assert sum(len(tokenizer(d)["input_ids"]) + 1 for d in train) < 6 * 2 * 2 * 32  # it did read past the end

    capsys.readouterr()
    assert torchrun_main.main([*flags, "--save_dir", str(resumed), "--continue_from", str(resumed)]) != 0
    assert "streaming" in capsys.readouterr().err
