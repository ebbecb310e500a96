"""MkDocs hook: the encodings table of docs/encodings.md, built from the encoding registry at every build, so
it lists exactly the encodings the installed posenc-bench has (a new encoding appears without editing a page).
"""

from __future__ import annotations

import re

PLACEHOLDER = "<!-- encodings table: generated from the registry by docs/hooks/encodings_table.py -->"
_CITATION = re.compile(r"^(?P<what>.*); (?P<paper>[^;]*\b(19|20)\d\d)$")


def rows() -> list[tuple[str, str, str, str, str]]:
    """(name, family, what, paper, whose model) of every registered encoding, in `posenc-bench list` order."""
    from posenc_bench import encodings

    out = []
    for name in encodings.available():
        cls = encodings.get_class(name)
        found = _CITATION.match(cls.summary)
        what, paper = (found["what"], found["paper"]) if found else (cls.summary, "")
        paper = getattr(cls, "paper", "") or paper  # the class's own citation, where it names one
        if cls.trained_as:
            model = f"`{cls.trained_as}`'s, " + ("fine-tuned" if cls.finetuned else "as trained (zero-shot)")
        else:
            model = "its own"
        out.append((name, encodings.family(cls), what, paper, model))
    return out


def table() -> str:
    lines = ["| name | family | what | paper | model evaluated |", "|---|---|---|---|---|"]
    lines += [f"| `{name}` | {fam} | {what} | {paper} | {model} |" for name, fam, what, paper, model in rows()]
    lines.append("| `<name>+sw<W>` | | any of the above with sliding-window attention over the last W tokens "
                 "| Beltagy et al. 2020 | |")
    lines.append("| `<name>+sink<S>+sw<W>` | attention sinks (zero-shot) | a trained encoding's model with a window of "
                 "W keys plus the first S tokens, positions re-indexed in the cache; `<name>+sw<W>+sink<S>`: the "
                 "model trained with that window | Xiao et al., ICLR 2024 (arXiv:2309.17453) | `<name>`'s, as "
                 "trained (zero-shot) |")
    return "\n".join(lines) + "\n"


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    return markdown.replace(PLACEHOLDER, table()) if PLACEHOLDER in markdown else markdown
