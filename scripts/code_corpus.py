"""An offline pretraining corpus of real text: the Python sources of installed packages, one file a document, as the
`.jsonl` that `torchrun_main.py --dataset` reads.

Issue 13 asks for the pretraining protocol at llama_60m size on a corpus of at least 50 MB, and a GPU machine reaches
no hub. Every machine with torch and transformers holds well over that in their sources (code, comments and
docstrings), so the corpus is made where it is used, from pinned packages, and named by what went in:

    python scripts/code_corpus.py --packages transformers,torch --min_mb 60 --out data/code.jsonl

Files are taken package by package in the order given, each package's in sorted path order, until `--min_mb` MB of
text is written (the file that crosses it is the last). What was used (package versions, files, bytes, SHA-256 of the
output) is printed as one JSON line and written beside the output as `<out>.manifest.json`; the same packages at the
same versions give the same file. `torchrun_main.py` holds out every 20th document for validation.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path


def package_root(name: str) -> Path:
    """The folder of an installed package (its import name)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"--packages: {name!r} is not an installed package (a folder with __init__.py); install it or "
                         "pick another, e.g. transformers,torch")
    return Path(next(iter(spec.submodule_search_locations)))


def sources(root: Path) -> Iterator[tuple[str, str]]:
    """(path relative to the package's parent, text) of every .py file under `root`, in sorted order; files that are
    not UTF-8 or are empty are skipped."""
    for path in sorted(root.rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if text.strip():
            yield str(path.relative_to(root.parent)), text


def version_of(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def write_corpus(packages: list[str], out: Path, min_bytes: int) -> dict:
    """Write the corpus and its manifest; returns the manifest."""
    out.parent.mkdir(parents=True, exist_ok=True)
    digest, written, files, used = hashlib.sha256(), 0, 0, {}
    temporary = out.with_name(out.name + ".tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        for name in packages:
            if written >= min_bytes:
                break
            used[name] = version_of(name)
            for _, text in sources(package_root(name)):
                line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
                handle.write(line)
                digest.update(line.encode("utf-8"))
                written += len(text.encode("utf-8"))
                files += 1
                if written >= min_bytes:
                    break
    if written < min_bytes:
        temporary.unlink()
        raise SystemExit(f"the sources of {', '.join(packages)} hold {written / 1e6:.1f} MB, less than --min_mb "
                         f"{min_bytes / 1e6:g}: add a package to --packages or lower --min_mb")
    temporary.replace(out)
    manifest = {"out": str(out), "packages": used, "files": files, "text_bytes": written, "sha256": digest.hexdigest(),
                "python": sys.version.split()[0]}
    Path(str(out) + ".manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", default="transformers,torch", help="comma-separated import names, in order")
    parser.add_argument("--min_mb", type=float, default=60.0, help="stop once this many MB of source text is written")
    parser.add_argument("--out", type=Path, default=Path("data/code.jsonl"))
    args = parser.parse_args(argv)
    if args.min_mb <= 0:
        parser.error(f"--min_mb must be > 0, got {args.min_mb}")
    print(json.dumps(write_corpus(args.packages.split(","), args.out, int(args.min_mb * 1e6))))


if __name__ == "__main__":
    main()
