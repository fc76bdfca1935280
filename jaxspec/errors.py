"""The error a refused setting raises: plain Python, so that the command line can name it
in its own words without importing JAX."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["SettingError"]


class SettingError(ValueError):
    """A refused setting, or a refused combination of settings.

    ``settings`` maps each setting's name (the library's argument or field name, e.g.
    ``"temperature"``, ``"scheme"``, ``"tree"``) to the value given, in the order they are
    named; ``expected`` says what would be accepted. The message names them in the
    library's words, ``scheme = 'iid' and tree = ...: expected ...``; a front end renders
    the same error in its own words with :meth:`render` (the command line: its flags), so
    no message is ever rewritten by pattern.
    """

    def __init__(self, settings: Mapping[str, Any], expected: str):
        self.settings = dict(settings)
        self.expected = expected
        super().__init__(self.render(lambda name, value: f"{name} = {value!r}"))

    def render(self, name_value: Callable[[str, Any], str]) -> str:
        """The message with each setting written as ``name_value(name, value)``."""
        return " and ".join(name_value(n, v) for n, v in self.settings.items()) + ": " + self.expected
