"""The code blocks of a Markdown page that tests run as written: found by their first line."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def block(page: Path, first_line: str, lang: str = "python") -> str:
    match = re.search(rf"```{lang}\n({re.escape(first_line)}\n.*?)```", page.read_text(), re.S)
    assert match, f"{page.name} lost its ```{lang} block starting with {first_line!r}"
    return match.group(1)
