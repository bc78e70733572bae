"""The documentation cannot drift from the code and the measurements: the
generated pages (docs/config.md, docs/benchmarks.md, the README's headline
numbers) are what `python -m docs.generate` writes now, every Config field is
documented, the README stays short, and every relative link in README.md and
docs/*.md leads to a file (and, into a Markdown page, to a heading) that
exists."""
import dataclasses
import re
from pathlib import Path

import pytest

from autopar import config
from docs import generate

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
README_MAX_LINES = 250


@pytest.mark.parametrize("path, text", sorted(generate.outputs().items()),
                         ids=lambda x: str(x.relative_to(REPO)) if isinstance(x, Path) else "")
def test_generated_docs_are_up_to_date(path, text):
    assert path.read_text() == text, (f"{path.relative_to(REPO)} differs from what "
                                      "`make docs` (python -m docs.generate) writes: run it")


@pytest.mark.parametrize("cls", [config.Config, config.SimulatedDelay], ids=lambda c: c.__name__)
def test_every_config_field_has_a_docstring(cls):
    docs, _ = generate.declarations(cls)    # Config's plan fields: transforms/options.py
    missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name, "").strip()]
    assert not missing, f"{cls.__name__} fields without a docstring: {missing}"


def test_readme_is_short_and_keeps_the_test_command():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    assert re.search(r"^make test\b", text, re.M), "the README's test command is `make test`"
    assert "make test" in (REPO / ".ci" / "run").read_text()


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces
    as hyphens (markup such as `code` and [links](x) reduced to its text)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _without_code(text: str) -> str:
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(path: Path) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", _without_code(path.read_text()))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_lead_somewhere(page):
    broken = []
    for link in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", link):   # http:, https:, mailto:
            continue
        target, _, anchor = link.partition("#")
        file = (page.parent / target).resolve() if target else page
        if not file.exists():
            broken.append(f"{link}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{link}: no heading #{anchor} in {file.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_the_checks_themselves():
    assert _slug("2-D summation") == "2-d-summation"
    assert _slug("Joining through `TF_CONFIG`") == "joining-through-tf_config"
    assert _slug("Other users and the job's ports") == "other-users-and-the-jobs-ports"
    assert _links(REPO / "README.md"), "no links found: the link pattern is wrong"
