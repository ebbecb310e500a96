"""The docs site stays whole: every page is in the nav, the encodings table is the registry's, the README
points into pages that exist. (`mkdocs build --strict` in .ci/run checks links and renders; the results
page's table is checked in tests/analysis/test_report.py.)"""

import importlib.util
import re
from pathlib import Path

import yaml

from posenc_bench import encodings

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _hook():
    spec = importlib.util.spec_from_file_location("encodings_table", DOCS / "hooks" / "encodings_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages(nav):
    for item in nav:
        for value in item.values():
            yield from (_nav_pages(value) if isinstance(value, list) else [value])


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = list(_nav_pages(config["nav"]))
    assert sorted(nav) == sorted(str(p.relative_to(DOCS)) for p in DOCS.glob("*.md"))
    assert config["hooks"] == ["docs/hooks/encodings_table.py"] and config["strict"] is True


def test_the_encodings_table_is_built_from_the_registry():
    hook = _hook()
    page = (DOCS / "encodings.md").read_text()
    assert hook.PLACEHOLDER in page
    built = hook.on_page_markdown(page, None, None, None)
    for name in encodings.available():
        assert f"| `{name}` | {encodings.family(encodings.get_class(name))} |" in built
    row = dict((r[0], r) for r in hook.rows())
    assert row["alibi"][3] == encodings.get_class("alibi").paper == "Press et al., ICLR 2022 (arXiv:2108.12409)" and row["rope-yarn"][4] == "`rope`'s, as trained (zero-shot)"
    assert row["rope-linear-ft"][4] == "`rope`'s, fine-tuned" and row["nope"][4] == "its own"


def test_readme_links_into_docs_pages_that_exist():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(links) >= 10
    for link in links:
        assert (ROOT / link).exists(), link


def test_figures_the_docs_show_exist():
    for page in DOCS.glob("*.md"):
        for figure in re.findall(r"\]\((figures/[^)]+)\)", page.read_text()):
            assert (DOCS / figure).is_file(), f"{page.name}: {figure}"


def test_every_install_from_a_clone_puts_the_cpu_torch_first():
    """An extra's unpinned torch pulls a CUDA build of several GB: each page that installs the package from a
    clone says `pip install torch==2.13.0` before its first `pip install -e`."""
    for page in [ROOT / "README.md", *DOCS.glob("*.md")]:
        text = page.read_text()
        first = text.find("pip install -e")
        if first >= 0:
            torch_first = text.find("pip install torch==")
            assert 0 <= torch_first < first, page.name
