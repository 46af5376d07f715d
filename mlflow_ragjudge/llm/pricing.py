"""Token prices for cost accounting, in US dollars per million tokens.

Prices change; this table is a convenience with the list prices known when it was
written, not a source of truth. Extend or override it with :func:`register_price`
or the client's ``prices=`` argument. An unknown model costs ``None`` (not 0).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from ..core.text import is_cjk_char

# model name (or prefix) -> (input $/Mtok, output $/Mtok)
PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1": (2.00, 8.00),
    "text-embedding-3-small": (0.02, 0.0),
    "text-embedding-3-large": (0.13, 0.0),
    "claude-3-5-haiku": (0.80, 4.00),
    "claude-3-haiku": (0.25, 1.25),
    "claude-3-5-sonnet": (3.00, 15.00),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-haiku-4-5": (1.00, 5.00),
}
#: what a request costs through the provider's batch API, as a share of its synchronous price: OpenAI's Batch API
#: and Anthropic's Message Batches both charge half (their pricing pages, 2024-2026)
BATCH_DISCOUNT: dict[str, float] = {"openai": 0.5, "anthropic": 0.5}
_lock = threading.Lock()


def register_price(model: str, input_per_mtok: float, output_per_mtok: float) -> None:
    """Add or replace a model's price (matched exactly, or as the longest prefix)."""
    with _lock:
        PRICES[model] = (float(input_per_mtok), float(output_per_mtok))


def price_for(model: str, table: dict[str, tuple[float, float]] | None = None) -> tuple[float, float] | None:
    """Price of ``model``: exact match first, then the longest known prefix."""
    prices = {**PRICES, **(table or {})}
    if model in prices:
        return prices[model]
    best = max((k for k in prices if model.startswith(k)), key=len, default=None)
    return prices[best] if best else None


def cost_usd(model: str, input_tokens: int, output_tokens: int,
             table: dict[str, tuple[float, float]] | None = None, *, batch_provider: str | None = None) -> float | None:
    """The price of one request; ``batch_provider`` (``openai``, ``anthropic``): sent through that provider's batch
    API, at :data:`BATCH_DISCOUNT` of the price."""
    price = price_for(model, table)
    if price is None:
        return None
    cost = (input_tokens * price[0] + output_tokens * price[1]) / 1_000_000
    return cost * BATCH_DISCOUNT.get(batch_provider, 1.0) if batch_provider else cost


def approx_tokens(text: str) -> int:
    """A deliberately high estimate of a text's token count, with no tokenizer.

    CJK characters count 1.5 tokens each, any other character 1/3 of a token (BPE tokenizers
    average about 4 characters per token on English prose and 1-2 tokens per CJK character).
    """
    if not text:
        return 0
    cjk = sum(1 for ch in text if is_cjk_char(ch))
    return math.ceil(cjk * 1.5 + (len(text) - cjk) / 3)


def messages_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """A deliberately high estimate of a chat request's prompt tokens: :func:`approx_tokens` of each message's
    content, and 4 tokens of overhead per message."""
    total = 0
    for m in messages:
        content = m.get("content")
        total += approx_tokens(content if isinstance(content, str) else str(content or "")) + 4
    return total
