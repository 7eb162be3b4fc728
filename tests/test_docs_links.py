"""Every relative link in README.md and docs/*.md points to a file the repository holds."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def relative_links(md: Path) -> list[str]:
    text = FENCE.sub("", md.read_text(encoding="utf-8"))
    targets = [m.group(1) for m in LINK.finditer(text)]
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def broken_links(md: Path) -> list[str]:
    return [t for t in relative_links(md) if not (md.parent / t.split("#", 1)[0]).exists()]


def test_every_relative_markdown_link_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = {str(p.relative_to(ROOT)): b for p in pages if (b := broken_links(p))}
    assert not broken, f"links to files that do not exist: {broken}"


def test_the_check_sees_links_and_catches_a_broken_one(tmp_path):
    (tmp_path / "there.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#part) ![img](missing.png) [web](https://example.org) [a](#top)\n"
                    "```\n[in a fence](nowhere.md)\n```\n")
    assert relative_links(page) == ["there.md#part", "missing.png"]
    assert broken_links(page) == ["missing.png"]


def test_the_readme_stays_a_short_users_document():
    lines = (Path(__file__).resolve().parent.parent / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; the bar is 150 (details go to docs/)"
