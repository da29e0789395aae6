"""Where the templates and the C runtime live: inside the installed package (``aotc.templates``,
``aotc.runtime``, mapped from the top-level folders by pyproject.toml), or next to the package in a
source checkout."""

from __future__ import annotations

from pathlib import Path


def _find(sub: str) -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / sub, here.parent / sub):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"aotc installation is missing its {sub}/ folder")


def templates_dir() -> Path:
    return _find("templates")


def runtime_dir() -> Path:
    return _find("runtime")
