"""Words in messages: counts with their noun in the right number."""
from __future__ import annotations


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 host``, ``2 hosts``, ``0 servers`` (``nouns``: an irregular plural)."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"
