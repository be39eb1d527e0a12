"""Documents -> packed sequences -> micro-batches, with a position that a checkpoint can restore.

Every document is tokenized, followed by EOS and concatenated into one stream that is cut into
`max_length` sequences: no padding, so every position is a training token. Two sources:

- in memory (the bundled corpus, a local .txt/.jsonl): the order of sequences is a fresh permutation
  per epoch seeded by (seed, epoch); rank r of W reads the r-th slice of every global batch. The
  position is the number of micro-batches consumed, so resuming is O(1) and exact.
- streamed (C4 or another hub dataset, or a local file with --streaming: local_stream.py): shuffled with a
  seeded buffer and split by node as GaLore does; resuming re-reads and skips the micro-batches already consumed.
  A hub stream is read once; a local file again at its end, each epoch shuffled anew.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Iterator, Sequence

import torch

from .config import BUNDLED, DEFAULT_TOKENIZER, TrainConfig, is_local_file, is_streamed
from .corpus import fetch_corpus, split_works
from .distributed import Dist
from .documents import HELD_OUT_EVERY, held_out, read_documents
from .local_stream import bpe_sample, stream_local_file
from .tokenizer import load_tokenizer

ENCODE_CHUNK = 256  # documents per tokenizer call
SHUFFLE_BUFFER = 10_000  # documents in a streamed dataset's shuffle buffer


# ----------------------------------------------------------------- documents
def load_texts(config: TrainConfig) -> tuple[list[str], list[str]]:
    """(train, validation) documents of an in-memory source."""
    if config.dataset == BUNDLED:
        train, validation = split_works(fetch_corpus(config.data_dir))
        return [p.read_text() for p in train], [p.read_text() for p in validation]
    documents = read_documents(config.dataset)
    if len(documents) < 2:
        raise ValueError(f"--dataset {config.dataset!r} holds {len(documents)} document(s); validation needs at least "
                         "2 (documents are separated by blank lines in .txt, one per line in .jsonl)")
    # every 20th document is held out, so validation text never appears in training
    if len(documents) < HELD_OUT_EVERY:
        print(f"WARNING: --dataset {config.dataset!r} holds {len(documents)} documents, fewer than {HELD_OUT_EVERY}: "
              "its last document alone is held out for validation, so the eval loss is a noisy figure",
              file=sys.stderr)
        return documents[:-1], documents[-1:]
    train = [d for i, d in enumerate(documents) if not held_out(i)]
    validation = [d for i, d in enumerate(documents) if held_out(i)]
    return train, validation


def encode(documents: Iterable[str], tokenizer) -> Iterator[list[int]]:
    """Token ids of each document followed by EOS (no BOS, no truncation)."""
    batch: list[str] = []
    for document in documents:
        batch.append(document)
        if len(batch) == ENCODE_CHUNK:
            yield from _encode_batch(batch, tokenizer)
            batch = []
    if batch:
        yield from _encode_batch(batch, tokenizer)


def _encode_batch(batch: list[str], tokenizer) -> Iterator[list[int]]:
    for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
        yield ids + [tokenizer.eos_token_id]


def pack(documents: Sequence[str], tokenizer, max_length: int) -> torch.Tensor:
    """(n_sequences, max_length) int64 tensor; the tail shorter than one sequence is dropped."""
    stream = torch.tensor([t for ids in encode(documents, tokenizer) for t in ids], dtype=torch.int64)
    n = stream.numel() // max_length
    if n == 0:
        raise ValueError(f"{stream.numel()} tokens cannot fill one sequence of --max_length {max_length}; "
                         "use more text or a shorter --max_length")
    return stream[: n * max_length].view(n, max_length)


# ----------------------------------------------------------------- in-memory batches
class ShuffledBatches:
    """Micro-batches of one rank over a per-epoch permutation of the sequences.

    Global micro-batch k of the run takes sequences k·B·W … (k+1)·B·W − 1 of the endless concatenation of
    epoch permutations; rank r takes its B of them. `position` (micro-batches consumed) is all the state.
    """

    def __init__(self, sequences: torch.Tensor, batch_size: int, seed: int, rank: int = 0, world_size: int = 1):
        if len(sequences) < batch_size * world_size:
            raise ValueError(f"{len(sequences)} training sequences cannot fill one global micro-batch of "
                             f"batch_size x world_size = {batch_size * world_size}; use more text or smaller batches")
        self.sequences, self.batch_size, self.seed = sequences, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.position = 0
        self._perm_epoch, self._perm = -1, None

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch != self._perm_epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm, self._perm_epoch = torch.randperm(len(self.sequences), generator=generator), epoch
        return self._perm

    def next_batch(self) -> torch.Tensor:
        n, width = len(self.sequences), self.batch_size * self.world_size
        first = self.position * width + self.rank * self.batch_size
        indices = []
        for g in range(first, first + self.batch_size):
            indices.append(self._order(g // n)[g % n])
        self.position += 1
        return self.sequences[torch.stack(indices)]

    def first_repeat_update(self, accumulation: int) -> int:
        """The update (0-based, of `accumulation` micro-batches) that begins reading the training sequences again."""
        return len(self.sequences) // (self.batch_size * self.world_size * accumulation)

    @property
    def passes(self) -> float:
        """How many times the run has read the training sequences so far (1.5: once, and half again)."""
        return self.position * self.batch_size * self.world_size / len(self.sequences)

    def state_dict(self) -> dict:
        return {"position": self.position, "sequences": len(self.sequences), "seed": self.seed}

    def load_state_dict(self, state: dict, saved_width: int | None = None) -> None:
        """`saved_width`: the writer's sequences per global micro-batch (its batch_size x world_size), when it split
        the same updates otherwise; the position moves over as the number of sequences consumed."""
        if state["sequences"] != len(self.sequences) or state["seed"] != self.seed:
            raise ValueError(f"the checkpoint was trained on {state['sequences']} sequences with seed {state['seed']}, "
                             f"this run has {len(self.sequences)} with seed {self.seed}: resume with the same "
                             "--dataset, --tokenizer, --max_length and --seed")
        width = self.batch_size * self.world_size
        consumed = state["position"] * (saved_width or width)
        if consumed % width:
            raise ValueError(f"the checkpoint had consumed {consumed} training sequences, not a whole number of this "
                             f"run's micro-batches of batch_size x world_size = {width}: resume with a batch_size x "
                             "world_size that divides --total_batch_size")
        self.position = consumed // width


# ----------------------------------------------------------------- streamed batches
def packed_stream(documents: Iterable[str], tokenizer, max_length: int, batch_size: int) -> Iterator[torch.Tensor]:
    """(batch_size, max_length) batches packed from a document stream."""
    buffer: list[int] = []
    rows: list[torch.Tensor] = []
    for ids in encode(documents, tokenizer):
        buffer.extend(ids)
        while len(buffer) >= max_length:
            rows.append(torch.tensor(buffer[:max_length], dtype=torch.int64))
            del buffer[:max_length]
            if len(rows) == batch_size:
                yield torch.stack(rows)
                rows = []


class StreamedBatches(torch.utils.data.IterableDataset):
    """Micro-batches from a streamed dataset, split over ranks and DataLoader workers.

    The DataLoader takes batches from its workers in turn, so the k-th batch came from worker k mod W.
    Resuming after `skip` batches relabels the workers so the first one asked is the one that was next,
    and each skips the batches it had already given.

    `epoch_seed` None: the dataset is read once, as given (a hub dataset, shuffled by stream_hub_dataset). An int: it
    is read again and again, epoch e shuffled with seed epoch_seed + e (a local file streamed, local_stream.py); each
    worker's packing runs on across its epochs, so a resume in any epoch skips to the same batch.
    """

    def __init__(self, dataset, tokenizer, max_length: int, batch_size: int, rank: int = 0, world_size: int = 1,
                 skip: int = 0, epoch_seed: int | None = None):
        self.dataset, self.tokenizer = dataset, tokenizer
        self.max_length, self.batch_size = max_length, batch_size
        self.rank, self.world_size, self.skip = rank, world_size, skip
        self.epoch_seed = epoch_seed

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        logical = (worker + self.skip) % workers
        already = max(0, (self.skip - logical + workers - 1) // workers)
        if info is not None:  # as datasets does in a worker: a forked child must not wait on the parent's fsspec loop
            import fsspec.asyn

            fsspec.asyn.reset_lock()
        node = self.rank * workers + logical, self.world_size * workers
        if self.epoch_seed is None:
            texts = _texts(self.dataset, *node)
        else:
            texts = itertools.chain.from_iterable(self._epoch(epoch, *node) for epoch in itertools.count())
        batches = packed_stream(texts, self.tokenizer, self.max_length, self.batch_size)
        for index, batch in enumerate(batches):
            if index >= already:
                yield batch

    def _epoch(self, epoch: int, node: int, nodes: int) -> Iterator[str]:
        """One pass over this node's share, shuffled for `epoch` (shuffle's seed, not datasets' set_epoch: that one
        lives in memory the DataLoader's workers share, and they reach their epochs at different times)."""
        shuffled = self.dataset.shuffle(seed=self.epoch_seed + epoch, buffer_size=SHUFFLE_BUFFER)
        empty = True
        for text in _texts(shuffled, node, nodes):
            empty = False
            yield text
        if empty:  # the next epoch would be empty too: never a batch, never an end
            raise ValueError(f"the streamed corpus has no training document for reader {node} of {nodes} (processes x "
                             "DataLoader workers); use a larger corpus, fewer --workers or fewer processes")


def _texts(dataset, node: int, nodes: int) -> Iterator[str]:
    """The texts of reader `node`'s share of `dataset` (split by node as GaLore does; a reader is one DataLoader
    worker of one process)."""
    import datasets.distributed

    shard = datasets.distributed.split_dataset_by_node(dataset, rank=node, world_size=nodes)
    # shard.iter(), not iter(shard): in a DataLoader worker, iter(shard) would split it again by the real worker
    # id, so worker w kept only its 1/workers of a shard already meant for it alone (and ignored `logical`)
    return (text for rows in shard.iter(batch_size=ENCODE_CHUNK) for text in rows["text"])


def stream_hub_dataset(name: str, split: str, seed: int):
    """A shuffled streaming split of a hub dataset ('allenai/c4' uses its 'en' configuration, as GaLore)."""
    import datasets

    try:
        if name == "allenai/c4":
            data = datasets.load_dataset(name, "en", split=split, streaming=True)
        else:
            data = datasets.load_dataset(name, split=split, streaming=True)
    except Exception as error:  # noqa: BLE001 - hub errors come in many classes; all mean "cannot stream it"
        raise ValueError(f"--dataset {name!r}: cannot stream its {split!r} split ({type(error).__name__}: {error}). "
                         f"Offline, use the default --dataset {BUNDLED} or a local .txt/.jsonl file") from None
    return data.shuffle(seed=seed, buffer_size=SHUFFLE_BUFFER)


# ----------------------------------------------------------------- evaluation
def eval_batches(sequences: torch.Tensor, batch_size: int, token_budget: int, rank: int = 0,
                 world_size: int = 1) -> list[torch.Tensor]:
    """The first ⌈budget / max_length⌉ validation sequences (a fixed set), dealt to ranks round-robin."""
    count = min(len(sequences), -(-token_budget // sequences.shape[1]))
    mine = sequences[:count][rank::world_size]
    return [mine[i : i + batch_size] for i in range(0, len(mine), batch_size)]


def streamed_eval_batches(dataset, tokenizer, max_length: int, batch_size: int, token_budget: int, rank: int = 0,
                          world_size: int = 1) -> list[torch.Tensor]:
    import datasets.distributed

    shard = datasets.distributed.split_dataset_by_node(dataset, rank=rank, world_size=world_size)
    batches, tokens, budget = [], 0, -(-token_budget // world_size)
    for batch in packed_stream((row["text"] for row in shard), tokenizer, max_length, batch_size):
        if tokens >= budget:
            break
        batches.append(batch)
        tokens += batch.numel()
    return batches


class Batches:
    """One interface over the data sources: next(), state_dict(), and the fixed validation batches."""

    def __init__(self, config: TrainConfig, context: Dist):
        self.config, self.context = config, context
        self.streamed = is_streamed(config.dataset, config.streaming)
        local_stream = self.streamed and is_local_file(config.dataset)
        if local_stream:
            texts = (bpe_sample(config.dataset) if config.tokenizer == DEFAULT_TOKENIZER else None, None)
        else:
            texts = (None, None) if self.streamed else load_texts(config)
        self.tokenizer = load_tokenizer(config.tokenizer, texts[0], config.vocab_size, config.data_dir, config.max_length)
        rank, world = context.rank, context.world_size
        if self.streamed:
            if local_stream:
                self._train_stream = stream_local_file(config.dataset, "train")
                validation = stream_local_file(config.dataset, "validation")
            else:
                self._train_stream = stream_hub_dataset(config.dataset, "train", config.seed)
                validation = stream_hub_dataset(config.dataset, "validation", config.seed)
            self._epoch_seed = config.seed if local_stream else None
            self.position = 0
            self._iterator = None
            self.validation = streamed_eval_batches(validation, self.tokenizer, config.max_length,
                                                    config.batch_size, config.eval_tokens, rank, world)
            if not self.validation:
                raise ValueError(f"--dataset {config.dataset!r}: its validation split fills no micro-batch of "
                                 f"{config.batch_size} x {config.max_length} tokens on rank {rank}; a local file needs "
                                 f"at least {HELD_OUT_EVERY} documents (every {HELD_OUT_EVERY}th is validation) and "
                                 "enough text in them: use a larger corpus, a smaller --batch_size or --max_length")
        else:
            train = pack(texts[0], self.tokenizer, config.max_length)
            self.shuffled = ShuffledBatches(train, config.batch_size, config.seed, rank, world)
            self.validation = eval_batches(pack(texts[1], self.tokenizer, config.max_length),
                                           config.batch_size, config.eval_tokens, rank, world)

    def next(self) -> torch.Tensor:
        if not self.streamed:
            return self.shuffled.next_batch()
        if self._iterator is None:
            dataset = StreamedBatches(self._train_stream, self.tokenizer, self.config.max_length,
                                      self.config.batch_size, self.context.rank, self.context.world_size,
                                      skip=self.position, epoch_seed=self._epoch_seed)
            loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=self.config.workers)
            self._iterator = iter(loader)
        try:
            batch = next(self._iterator)
        except StopIteration:  # a hub stream is read once; at its end the run cannot go on
            raise RuntimeError(f"--dataset {self.config.dataset!r} ran out after {self.position} micro-batches on "
                               f"rank {self.context.rank}; train for fewer updates (--num_training_steps, "
                               "--max_train_tokens)") from None
        self.position += 1
        return batch

    @property
    def passes(self) -> float | None:
        """Passes over the training text so far, where it is held in memory; None for a stream (its length is
        unknown until read). Past 1 the eval loss measures how a fit to text seen again holds on held-out text."""
        return None if self.streamed else self.shuffled.passes

    def state_dict(self) -> dict:
        return {"position": self.position} if self.streamed else self.shuffled.state_dict()

    def load_state_dict(self, state: dict, saved_width: int | None = None) -> None:
        """`saved_width` as ShuffledBatches'; a streamed dataset resumes with the writer's layout only (find_resume)."""
        if self.streamed != ("sequences" not in state):  # an in-memory position counts sequences, a stream's does not
            raise ValueError("the checkpoint read its --dataset " + ("in memory" if "sequences" in state else "as a stream")
                             + ", this run " + ("as a stream" if self.streamed else "in memory") + ": resume with the "
                             "checkpoint's --streaming")
        if self.streamed:
            self.position, self._iterator = state["position"], None
        else:
            self.shuffled.load_state_dict(state, saved_width)
