"""A local corpus as documents: .txt (documents separated by blank lines) or .jsonl (a 'text' field a line), read a
line at a time, and which of them are held out for validation. The in-memory path (data.load_texts) and the streamed
one (local_stream) read the same documents and hold out the same ones."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from .config import BUNDLED

HELD_OUT_EVERY = 20  # every 20th document of a local corpus is validation


def iter_documents(path: str | Path) -> Iterator[str]:
    """The documents of a local corpus, read a line at a time (a file larger than memory can be streamed).
    A .txt file: documents separated by blank lines. A .jsonl file: one object a line with a 'text' field.
    Documents empty after stripping are skipped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--dataset {str(path)!r}: no such file; pass an existing .txt/.jsonl, "
                                f"'{BUNDLED}' or 'allenai/c4'")
    with path.open(encoding="utf-8") as file:
        if path.suffix == ".txt":
            lines: list[str] = []
            for line in file:
                if line := line.rstrip("\n"):  # only an empty line ends a document (as splitting on "\n\n" would)
                    lines.append(line)
                elif lines:
                    if document := "\n".join(lines).strip():
                        yield document
                    lines = []
            if lines and (document := "\n".join(lines).strip()):
                yield document
            return
        for number, line in enumerate(file, 1):
            if line.strip():
                try:
                    document = json.loads(line)["text"]
                except (json.JSONDecodeError, KeyError, TypeError) as error:
                    raise ValueError(f"{path}:{number}: expected a JSON object with a 'text' field ({error})") from None
                if document:
                    yield document


def read_documents(path: str | Path) -> list[str]:
    """Every document of a local corpus (iter_documents), in memory."""
    return list(iter_documents(path))


def held_out(index: int) -> bool:
    """Every 20th document of a local corpus (indices 19, 39, ...) is validation, never trained on."""
    return index % HELD_OUT_EVERY == HELD_OUT_EVERY - 1
