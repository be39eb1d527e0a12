"""A local .txt/.jsonl corpus read as a stream (--streaming): for a corpus larger than memory, or too large to tokenize
before the first update.

The documents and the held-out split are the in-memory path's (documents.iter_documents, every 20th document
is validation), read a line at a time by `datasets` as a streaming split, so the batches go through the hub's
streaming path (data.StreamedBatches: DataLoader workers, split by process, resume by re-reading). Where a hub
stream is read once, a file is read again at its end: epoch e is shuffled with seed + e through a buffer of
data.SHUFFLE_BUFFER documents. The offline BPE (--tokenizer bpe) trains on the first BPE_SAMPLE_CHARS characters of the
training split instead of all of it.

A file is one shard: each reader (a DataLoader worker of one process) reads all of it and keeps every k-th document
of the k readers: more --workers tokenize in parallel, but each of them parses every line of the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from .documents import held_out, iter_documents

BPE_SAMPLE_CHARS = 20_000_000  # ~20 MB of text: a few seconds of BPE training, and its vocabulary has settled by then
PARTS = ("train", "validation")


def part_documents(path: str, part: str) -> Iterator[dict]:
    """The rows {'text': document} of one part of the file, in file order. A top-level function: DataLoader workers
    and `datasets` call it again in each process that reads the stream."""
    want_held_out = part == "validation"
    for index, document in enumerate(iter_documents(path)):
        if held_out(index) == want_held_out:
            yield {"text": document}


def stream_local_file(path: str | Path, part: str):
    """One part ('train' or 'validation') of a local corpus as a `datasets` streaming split, unshuffled (the train
    part is shuffled per epoch by its reader; validation is read in file order, as the in-memory path reads it)."""
    import datasets

    if part not in PARTS:
        raise ValueError(f"part {part!r}: expected one of {PARTS}")
    return datasets.IterableDataset.from_generator(part_documents, gen_kwargs={"path": str(path), "part": part})


def bpe_sample(path: str | Path, chars: int = BPE_SAMPLE_CHARS) -> list[str]:
    """The training documents from the file's start up to `chars` characters (at least one document): what the offline
    BPE trains on when the corpus is streamed. The same file gives the same sample, so the cached BPE is found again."""
    sample, total = [], 0
    for row in part_documents(str(path), "train"):
        if sample and total + len(row["text"]) > chars:
            break
        sample.append(row["text"])
        total += len(row["text"])
    return sample
