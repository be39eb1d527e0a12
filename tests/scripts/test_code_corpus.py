"""scripts/code_corpus.py: the offline .jsonl corpus of package sources is made in a fixed order, stops at its size,
names what went in, refuses a corpus too small, and is read by the training data code as documents."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import code_corpus  # noqa: E402


@pytest.fixture
def packages(tmp_path, monkeypatch):
    """Two importable packages: alpha (three sources, one not UTF-8, one empty) and beta (one)."""
    site = tmp_path / "site"
    for name, files in {"alpha": {"__init__.py": "A = 1\n", "z.py": "def z():\n    return 'z'\n",
                                  "sub/__init__.py": "", "sub/m.py": "# m\nM = 2\n"},
                        "beta": {"__init__.py": "B = 3\n" * 50}}.items():
        for relative, text in files.items():
            path = site / name / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    (site / "alpha" / "latin1.py").write_bytes(b"# caf\xe9\n")
    monkeypatch.syspath_prepend(str(site))
    return site


def _documents(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines()]


def test_sources_in_sorted_order_until_the_size_then_the_manifest(packages, tmp_path):
    out = tmp_path / "corpus.jsonl"
    manifest = code_corpus.write_corpus(["alpha", "beta"], out, min_bytes=1)  # one byte: the first file
    assert _documents(out) == ["A = 1\n"]
    manifest = code_corpus.write_corpus(["alpha", "beta"], out, min_bytes=41)
    documents = _documents(out)
    # alpha's UTF-8, non-empty files in sorted path order (40 bytes), then beta's, which crosses 41 and is the last
    assert documents == ["A = 1\n", "# m\nM = 2\n", "def z():\n    return 'z'\n", "B = 3\n" * 50]
    assert manifest["files"] == 4 and manifest["text_bytes"] == sum(len(d) for d in documents)
    assert manifest["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert set(manifest["packages"]) == {"alpha", "beta"}
    assert json.loads(Path(str(out) + ".manifest.json").read_text()) == manifest


def test_too_little_source_is_refused_and_nothing_is_left(packages, tmp_path):
    out = tmp_path / "corpus.jsonl"
    with pytest.raises(SystemExit, match="less than --min_mb"):
        code_corpus.write_corpus(["alpha"], out, min_bytes=10**6)
    assert list(tmp_path.glob("corpus*")) == []
    with pytest.raises(SystemExit, match="'nothing_here' is not an installed package"):
        code_corpus.write_corpus(["nothing_here"], out, min_bytes=1)


def test_the_training_code_reads_it_as_one_document_a_file(packages, tmp_path):
    from galore_plumage.training.data import read_documents

    out = tmp_path / "corpus.jsonl"
    code_corpus.write_corpus(["alpha", "beta"], out, min_bytes=41)
    assert read_documents(out) == _documents(out)
