"""Prices from the genai-prices database, with ``prices=`` overrides, on recorded replies."""

from __future__ import annotations

from collections import Counter
from typing import Any

import anthropic
import openai
import pytest
from genai_prices import Usage, calc_price
from provider_corpus import APIS, READINGS, Exchange, Refused, load

from fsm_agent.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel, Price

pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")


def adapter_for(e: Exchange, **kw: Any) -> Any:
    """An adapter whose client points at the recorded host (pricing reads only its URL;
    nothing is sent)."""
    model = e.request.get("model") or "unknown"
    if e.api == "anthropic_messages":
        client = anthropic.Anthropic(base_url=f"https://{e.host}", api_key="k")
        return AnthropicModel(model, client=client, **kw)
    suffix = "/chat/completions" if e.api == "openai_chat" else "/responses"
    base = f"https://{e.host}{e.path.split('?')[0].removesuffix(suffix)}"
    client_ = openai.OpenAI(base_url=base, api_key="k")
    cls = OpenAIChatModel if e.api == "openai_chat" else OpenAIResponsesModel
    return cls(model, client=client_, **kw)


def supported(api: str) -> list[Exchange]:
    return [
        e
        for e in load(api)
        if e.status == 200 and not isinstance(READINGS[api](e.response, []), Refused)
    ]


def test_recorded_replies_are_priced_by_the_database() -> None:
    priced: Counter[str] = Counter()
    total: Counter[str] = Counter()
    unpriced_first_party = []
    adapters: dict[tuple[str, str, str], Any] = {}  # an SDK client is slow to build
    for api in APIS:
        for e in supported(api):
            key = (api, e.host, e.path)
            if key not in adapters:
                adapters[key] = adapter_for(e)
            adapters[key].model = e.request.get("model") or "unknown"
            cost = adapters[key].read_reply(e.response, [], [])["usage"]["cost"]
            total[api] += 1
            priced[api] += cost is not None
            if cost is None and e.host in ("api.openai.com", "api.anthropic.com"):
                unpriced_first_party.append(e.source)
    # 805 of 835 when written; the rest are local servers and models the database lacks
    for api in APIS:
        assert priced[api] / total[api] > 0.9, (api, priced[api], total[api])
    assert unpriced_first_party == []


def test_database_cost_matches_genai_prices_and_overrides_win() -> None:
    e = next(
        x
        for x in supported("openai_chat")
        if x.host == "api.openai.com" and x.response.get("usage", {}).get("prompt_tokens")
    )
    reply = adapter_for(e).read_reply(e.response, [], [])
    usage = e.response["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    expected = calc_price(
        Usage(
            input_tokens=usage["prompt_tokens"],
            output_tokens=usage["completion_tokens"],
            cache_read_tokens=cached,
        ),
        e.response["model"],
        provider_api_url="https://api.openai.com/v1",
    )
    assert reply["usage"]["cost"] == pytest.approx(float(expected.total_price))
    own = adapter_for(e, prices={e.request["model"]: Price(input=1.0, output=1.0)})
    override = own.read_reply(e.response, [], [])
    assert override["usage"]["cost"] == pytest.approx(usage["total_tokens"] / 1e6)
    nothing = adapter_for(e, prices={}, price_db=False).read_reply(e.response, [], [])
    assert nothing["usage"]["cost"] is None  # never priced as free


def test_price_db_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="price_db must be True or False"):
        OpenAIChatModel("gpt-4o", api_key="k", price_db="no")
