"""The README read as its tests read it: sections, table rows, the numbers a cell quotes,
the opening answer of a results file and the python blocks."""
import re
from decimal import Decimal
from pathlib import Path
from typing import Iterable, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# 0.646, +1.10 (the sign is not compared), 2,289 (nor the separator), 121.47 ms, 8.6x, 16x16
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")
# a results file answers first; its sections (## ...), generated blocks (<!-- ... -->) and
# their subsections follow, older runs among them
DETAILS = re.compile(r"^(#{2,} |<!-- )", re.MULTILINE)


def readme() -> str:
    return README.read_text(encoding="utf-8")


def section(title: str, text: str) -> str:
    """The body of the ``## title`` section of the markdown ``text``."""
    parts = re.split(r"^## (.+)\n", text, flags=re.MULTILINE)
    bodies = dict(zip(parts[1::2], parts[2::2]))
    assert title in bodies, f"no section '## {title}' (sections: {list(bodies)})"
    return bodies[title]


def table_rows(text: str) -> List[List[str]]:
    """The cells of each body row of the markdown tables in ``text`` (no header rows)."""
    rows, body = [], False
    for line in text.splitlines():
        if not line.startswith("|"):
            body = False
        elif set(line) <= set("|-: "):
            body = True  # (the separator under a header)
        elif body:
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def numbers(text: str) -> List[str]:
    """The numbers ``text`` writes, without signs and thousands separators."""
    return [n.replace(",", "") for n in NUMBER.findall(text)]


def quotes(number: str, source: Iterable[str]) -> bool:
    """Whether ``number`` is one of the numbers ``source`` writes, rounded to the decimals
    ``number`` shows (0.10 quotes 0.0969, 438 quotes 438.2; 0.1 does not quote 0.12)."""
    decimals = len(number.partition(".")[2])
    value, half = Decimal(number), Decimal(5) / 10 ** (decimals + 1)
    return any(len(s.partition(".")[2]) >= decimals and abs(Decimal(s) - value) <= half
               for s in source)


def opening_answer(text: str) -> str:
    """A results file's answer: its text before the first section or generated block."""
    match = DETAILS.search(text)
    return text[:match.start()] if match else text


def python_blocks(text: str) -> List[str]:
    """The code of every fenced python block of the markdown ``text``, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def section_blocks(text: str) -> List[Tuple[str, str]]:
    """(section title, code) for every fenced python block of the markdown ``text``."""
    parts = re.split(r"^## (.+)\n", text, flags=re.MULTILINE)
    return [(title, code) for title, body in zip(["", *parts[1::2]], parts[0::2])
            for code in python_blocks(body)]
