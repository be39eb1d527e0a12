"""The docs stay true to the tree: every relative link leads to a file, every option has its README row.

Text moves between the README and docs/ as they grow; a link written relative to the old file breaks silently.
"""

from __future__ import annotations

import re
from pathlib import Path

from galore_plumage.optimizers.options import OPTIONS

ROOT = Path(__file__).resolve().parents[1]
# a markdown link's target: what stands between "](" and ")"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks").glob("*.md"))]


def relative_links(path: Path) -> list[str]:
    """The links of `path` that name a file of this tree (no web address, no bare anchor)."""
    targets = LINK.findall(path.read_text(encoding="utf-8"))
    return [t for t in targets if not t.startswith(("http://", "https://", "mailto:", "#"))]


def test_the_link_pattern_finds_a_relative_link_and_skips_web_addresses(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("see [a](a.md#part), [b](https://x.org/b.md) and [c](#top)\n", encoding="utf-8")
    assert relative_links(page) == ["a.md#part"]


def test_every_relative_link_in_the_docs_leads_to_a_file():
    broken = []
    for path in markdown_files():
        for target in relative_links(path):
            if not (path.parent / target.split("#")[0]).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert len(markdown_files()) > 10, "the docs were not found"
    assert not broken, "links to nothing (write them relative to the file they are in): " + ", ".join(broken)


def test_every_option_has_a_row_in_the_readme_table():
    first_cells = set()
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("| `"):
            first_cells.update(re.findall(r"`([a-z_0-9]+)`", line.split("|")[1]))
    missing = [option.key for option in OPTIONS if option.key not in first_cells]
    assert not missing, f"options without a README row (add one to the options table): {missing}"
