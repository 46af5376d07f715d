"""Against real providers: opt in with RAGJUDGE_REAL_PROVIDER_TESTS=1 and the provider's API key.

Skipped everywhere else (CI has neither key nor network). They check that the judges work end to end with
the real APIs' structured output: a clearly correct response scores 4-5, a fatally wrong one 1-2.
"""

from __future__ import annotations

import os

import pandas as pd
import pytest

from mlflow_ragjudge import evaluate_frame

pytestmark = pytest.mark.real_provider

MODELS = {
    "openai": ("OPENAI_API_KEY", os.environ.get("RAGJUDGE_TEST_OPENAI_MODEL", "gpt-4o-mini")),
    "anthropic": ("ANTHROPIC_API_KEY", os.environ.get("RAGJUDGE_TEST_ANTHROPIC_MODEL", "claude-3-5-haiku-latest")),
}


def _judge(provider: str) -> str:
    key, model = MODELS[provider]
    if os.environ.get("RAGJUDGE_REAL_PROVIDER_TESTS") != "1" or not os.environ.get(key):
        pytest.skip(f"real-provider test: set RAGJUDGE_REAL_PROVIDER_TESTS=1 and {key} to run it")
    return f"{provider}:/{model}"


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_correctness_and_faithfulness_with_a_real_judge(provider):
    judge = _judge(provider)
    df = pd.DataFrame({
        "question": ["What is the difference between UNION and UNION ALL?"] * 2,
        "answer": ["UNION removes duplicate rows; UNION ALL keeps all rows including duplicates.",
                   "UNION keeps duplicates and UNION ALL removes them."],
        "reference": ["UNION removes duplicate rows from the combined result; UNION ALL keeps them."] * 2,
        "contexts": [["UNION eliminates duplicate rows. UNION ALL returns all rows, duplicates included."]] * 2,
    })
    out = evaluate_frame(df, judge=judge, metrics=["correctness", "faithfulness"], cache=False)
    scores = out.table["correctness/score"].tolist()
    assert scores[0] >= 4 and scores[1] <= 2
    assert out.metrics["correctness/error_rate"] == 0 and out.metrics["faithfulness/error_rate"] == 0
    assert out.results["faithfulness"][0].value > out.results["faithfulness"][1].value
