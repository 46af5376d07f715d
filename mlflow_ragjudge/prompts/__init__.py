"""Versioned prompt templates, kept as data (one JSON file per prompt and language).

A template names its slots as ``{{slot}}``; rendering replaces exactly those, so
braces in user data or in JSON examples need no escaping. The version string goes
into the cache key, the results and the MLflow params (DESIGN point 10): editing a
prompt means bumping its version.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["Prompt", "load_prompt", "available_prompts"]

_SLOT = re.compile(r"\{\{\s*(\w+)\s*\}\}")


@dataclass(frozen=True)
class Prompt:
    """A prompt template: ``system`` and ``user`` text plus named format variants."""

    name: str
    version: str
    language: str
    system: str
    user: str
    formats: dict[str, str]
    schema: dict[str, Any] | None = None

    @property
    def id(self) -> str:
        return f"{self.name}/{self.version}/{self.language}"

    def slots(self) -> set[str]:
        return set(_SLOT.findall(self.system)) | set(_SLOT.findall(self.user))

    def render(self, fmt: str | None = None, **values: str) -> list[dict[str, str]]:
        """Messages with every slot filled; a missing slot is an error, not a blank."""
        if fmt is not None:
            if fmt not in self.formats:
                raise KeyError(f"prompt {self.id} has no format {fmt!r}; it has {sorted(self.formats)}")
            values = {**values, "format_instructions": self.formats[fmt]}
        missing = self.slots() - set(values)
        if missing:
            raise KeyError(f"prompt {self.id} needs values for {sorted(missing)}")

        def fill(text: str) -> str:
            return _SLOT.sub(lambda m: str(values[m.group(1)]), text)

        msgs = []
        if self.system:
            msgs.append({"role": "system", "content": fill(self.system)})
        msgs.append({"role": "user", "content": fill(self.user)})
        return msgs


def available_prompts() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(__name__).iterdir() if p.name.endswith(".json"))


@cache
def load_prompt(name: str, language: str = "en") -> Prompt:
    """Load ``<name>.<language>.json``; falls back to English for other languages.

    Inputs in any language work with the English prompt; a language variant only
    changes the judge's instructions.
    """
    files = resources.files(__name__)
    path = files / f"{name}.{language}.json"
    if not path.is_file():
        if language != "en":
            return load_prompt(name, "en")
        raise FileNotFoundError(f"no prompt {name!r}; available: {available_prompts()}")
    d = json.loads(path.read_text(encoding="utf-8"))
    return Prompt(
        name=d["name"], version=d["version"], language=d["language"], system=d.get("system", ""),
        user=d["user"], formats=d.get("formats", {}), schema=d.get("schema"),
    )
