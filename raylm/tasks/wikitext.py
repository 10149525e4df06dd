"""WikiText-2 perplexity: whole documents scored by rolling loglikelihood, as lm-eval's wikitext task does.

The model scores the detokenized page, but words and bytes are counted on the original page: that is lm-eval's
definition, and word perplexity is only comparable across tokenizers because of it.
"""

from __future__ import annotations

import re
from pathlib import Path

from raylm.data.rows import Row, read_hub, read_text_lines
from raylm.tasks.base import Task, TextDoc

_LEVEL1_HEADING = re.compile(r"^ = [^=].* = $")


def split_pages(lines: list[str]) -> list[str]:
    """Split tokenized WikiText into articles: a level-1 heading starts a new one once the current has text."""
    pages: list[str] = []
    current: list[str] = []
    for line in lines:
        if _LEVEL1_HEADING.match(line.rstrip("\n")) and "".join(current).strip():
            pages.append("".join(current))
            current = []
        current.append(line)
    if current:
        pages.append("".join(current))
    return pages


def detokenize(page: str) -> str:
    """lm-eval's wikitext detokenizer, rule for rule, so the model sees exactly the same text."""
    s = page.replace("s '", "s'")
    s = re.sub(r"/' [0-9]/", r"/'[0-9]/", s)
    for tokenized, plain in ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."), (" : ", ": "), (" ; ", "; "),
                             (" . ", ". "), (" ! ", "! "), (" ? ", "? "), (" , ", ", ")):
        s = s.replace(tokenized, plain)
    s = re.sub(r"\(\s*([^\)]*?)\s*\)", r"(\1)", s)
    s = re.sub(r"\[\s*([^\]]*?)\s*\]", r"[\1]", s)
    s = re.sub(r"{\s*([^}]*?)\s*}", r"{\1}", s)
    s = re.sub(r"\"\s*([^\"]*?)\s*\"", r'"\1"', s)
    s = re.sub(r"'\s*([^']*?)\s*'", r"'\1'", s)
    for tokenized, plain in (("= = = =", "===="), ("= = =", "==="), ("= =", "=="), (" " + chr(176) + " ", chr(176)),
                             (" \n", "\n"), ("\n ", "\n"), (" N ", " 1 "), (" 's", "'s")):
        s = s.replace(tokenized, plain)
    return s


def doc_from_page(doc_id: int, page: str) -> TextDoc:
    return TextDoc(doc_id, detokenize(page), len(re.split(r"\s+", page)), len(page.encode("utf-8")))


def load_rows(data_dir: Path | None) -> list[Row]:
    """Rows of one field, `page`, as lm-eval's wikitext task reads them: the hub's document-level pages, or the
    pages of --data-dir's tokenized test.txt (split_pages), one row per page."""
    if data_dir is None:
        return read_hub("EleutherAI/wikitext_document_level", "wikitext-2-raw-v1", "test")
    path = data_dir / "wikitext-2" / "test.txt"
    return [Row(str(path), number, {"page": page})
            for number, page in enumerate(split_pages(read_text_lines(path)), 1)]


def load_docs(data_dir: Path | None) -> list[TextDoc]:
    return [doc_from_page(i, _page(row)) for i, row in enumerate(load_rows(data_dir))]


def _page(row: Row) -> str:
    page = row.get("page", str)
    if not page.strip():
        raise row.fail("empty page", "page")
    return page


TASK = Task("wikitext", "rolling", load_docs, load_rows=load_rows)
