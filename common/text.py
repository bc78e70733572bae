"""Words in messages: counts with their noun in the right number, byte sizes."""
from __future__ import annotations


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 host``, ``2 hosts``, ``0 servers`` (``nouns``: an irregular plural)."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def human_bytes(n: float) -> str:
    """``512 B``, ``37.5 KB``, ``1.2 GB``."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"
