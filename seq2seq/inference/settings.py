"""Search settings, in a module without torch so the prompt can start before torch loads."""

from __future__ import annotations

from dataclasses import dataclass

from seq2seq.errors import ConfigError


@dataclass
class SearchSettings:
    """How an output is searched: the length penalty ``alpha`` and the output-length cap
    ``int(max_len_ratio * source length) + max_len_extra`` (see the module docstring)."""

    alpha: float = 0.6
    max_len_ratio: float = 2.0
    max_len_extra: int = 10

    def check(self) -> None:
        """ConfigError on a setting no search can use."""
        if self.alpha < 0 or self.max_len_ratio <= 0 or self.max_len_extra < 0:
            raise ConfigError(f"alpha={self.alpha} must be >= 0, max_len_ratio="
                              f"{self.max_len_ratio} > 0 and max_len_extra={self.max_len_extra} >= 0")
