"""Answer relevancy (RAGAS, Es et al. 2023; seeds 002, 003; SPEC 2.4).

One LLM call writes ``n`` (default 3) questions that the response would answer and flags a
noncommittal response (evasive, "I don't know", "it depends"). The questions and the user's
question are embedded with the ``embed`` callable (``client.embed`` for an API model, or
``LocalEmbedder.embed`` for the local MiniLM), and

    answer_relevancy = (1/n) Σ_i cos(E(q), E(q_i))

(:func:`mlflow_ragjudge.core.claims.mean_cosine`). A noncommittal response scores 0, as in RAGAS
(a scored 0 with the reason in the rationale, not an abstention: the answer really does not
address the question); so does an empty response, with no call. ragas asks for the ``n``
questions in ``n`` separate calls; here they come in one.

The call's schema asks for exactly ``n`` non-empty questions. A reply with fewer (but at least
one) is used as it is -- the mean runs over the questions received -- and ``details`` records
``n_generated``; extra questions beyond ``n`` are left out (recorded as ``n_dropped``); a reply
with none (and not noncommittal) is re-asked (within the attempts budget, up to 5 times, `max_reasks`), then
fails ``inconsistent``.

The cosine is the embedding model's: with most sentence-embedding models it lies in [0, 1] in
practice, but it is not clipped, so a negative similarity stays visible.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ..core import claims as claim_math
from ..core.text import UNIDENTIFIED_LANGUAGE, latin_language, non_latin_script
from ..core.types import FailureReason, JudgeResult
from ..core.values import is_int
from ..llm.backends import BackendError, ChatRequest, ChatResponse, JsonSchema
from ..llm.client import FAILURE_FOR_KIND, JudgeClient
from ..llm.parsing import ParseError, reply_object, validate_schema
from ..llm.prompts import load_prompt
from .spec import Estimate, MetricSpec, Needs, Option, Outputs, RunContext
from .statements import estimate_messages, failed_result, prompt_version

__all__ = ["AnswerRelevancyJudge"]

Embed = Callable[[list[str]], Sequence[Sequence[float]]]



class AnswerRelevancyJudge:
    """How well the response addresses the question, via questions generated back from it.

    Args:
        client: the judge client (question generation).
        embed: ``list[str] -> list[vector]``, e.g. ``client.embed`` or ``LocalEmbedder.load().embed``.
        n: questions to generate (RAGAS uses 3; its ablation found 3 the best cost/quality point).
        language: prompt language, ``en`` or ``ja``.
        max_tokens: reply budget.
    """

    def __init__(
        self, client: JudgeClient, *, embed: Embed, n: int = 3, language: str = "en", max_tokens: int = 1024
    ) -> None:
        if n < 1:
            raise ValueError(f"n (questions to generate) must be >= 1, got {n}")
        if not callable(embed):
            raise TypeError("embed must be a callable list[str] -> list[list[float]], e.g. client.embed")
        self.client = client
        self.embed = embed
        self.n = n
        self.language = language
        self.max_tokens = max_tokens
        self.prompt = load_prompt("answer_relevancy", language)
        self.schema: dict[str, Any] = self.prompt.schema or {}

    @property
    def prompt_versions(self) -> dict[str, str]:
        return {"answer_relevancy": prompt_version(self.prompt)}

    def _messages(self, response: str) -> list[dict[str, str]]:
        return self.prompt.render("json", response=response.strip(), n=str(self.n))

    def call_schema(self) -> dict[str, Any]:
        """The per-call schema: exactly ``n`` non-empty questions."""
        schema = json.loads(json.dumps(self.schema))
        arr = schema["properties"]["questions"]
        arr["minItems"] = arr["maxItems"] = self.n
        arr["items"] = {"type": "string", "minLength": 1}
        return schema

    def _parse(self, response: ChatResponse) -> dict[str, Any]:
        obj = reply_object(response, self.schema)
        validate_schema(obj, self.schema)  # the base schema: any count; the count rules follow
        questions = [q for q in (" ".join(q.split()) for q in obj["questions"]) if q]
        noncommittal = obj["noncommittal"]
        if not noncommittal and not questions:
            raise ParseError(f"no question was generated; write {self.n} questions that the response answers",
                             FailureReason.INCONSISTENT)
        return {"questions": questions[: self.n], "noncommittal": noncommittal,
                "n_generated": len(questions), "n_dropped": max(0, len(questions) - self.n)}

    def judge(self, question: str, response: str) -> JudgeResult:
        """Judge one row. Never raises for model or embedding failures."""
        details: dict[str, Any] = {"prompt_versions": self.prompt_versions, "n": self.n}
        if not (question or "").strip():
            return JudgeResult.failed(FailureReason.INVALID_INPUT, "answer relevancy needs the question; it is empty.",
                                      details=details)
        if not (response or "").strip():
            details.update(noncommittal=True, empty_response=True, generated_questions=[])
            return JudgeResult.scored(0.0, "The response is empty, so it does not address the question (score 0).",
                                      details=details)
        refused = self._unsupported_language(question, response)
        if refused:
            details["unsupported_language"] = refused
            return JudgeResult.abstained(
                "unsupported_language",
                f"Not scored: this row is in {refused}, and the embedding model ({self._embedder_name()}) is "
                f"English-only, so its similarity would mean nothing. Give a multilingual embedding model "
                f"(embeddings='openai:/text-embedding-3-small' or any embeddings URI or callable).", details=details)
        request = ChatRequest.of(
            self._messages(response), max_tokens=self.max_tokens,
            json_schema=JsonSchema("answer_relevancy_questions", self.call_schema()),
        )
        call = self.client.call(request, parse=self._parse, prompt_version=prompt_version(self.prompt),
                                purpose="answer_relevancy")
        calls = list(call.records)
        if not call.ok:
            return failed_result(call, stage="question generation", details=details, calls=calls)
        generated: list[str] = call.parsed["questions"]
        details["noncommittal"] = call.parsed["noncommittal"]
        details["n_generated"] = call.parsed["n_generated"]
        if call.parsed["n_dropped"]:
            details["n_dropped"] = call.parsed["n_dropped"]
        if call.parsed["noncommittal"]:
            details["generated_questions"] = [{"question": q, "similarity": None} for q in generated]
            return JudgeResult.scored(
                0.0, "The response is noncommittal (evasive or 'I don't know'), so it scores 0 as in RAGAS.",
                raw=call.raw, details=details, calls=calls,
            )
        texts = [question.strip(), *generated]
        try:
            vectors = [list(map(float, v)) for v in self.embed(texts)]
            if len(vectors) != len(texts):
                raise ValueError(f"embed returned {len(vectors)} vectors for {len(texts)} texts")
            sims = [claim_math.cosine(vectors[0], v) for v in vectors[1:]]
        except BackendError as e:
            details["generated_questions"] = [{"question": q, "similarity": None} for q in generated]
            return JudgeResult.failed(FAILURE_FOR_KIND.get(e.kind, FailureReason.PROVIDER_ERROR),
                                      f"embedding: {e}", raw=call.raw, details=details, calls=calls)
        except Exception as e:  # an embedder bug or a missing local model: the row fails, the run goes on
            details["generated_questions"] = [{"question": q, "similarity": None} for q in generated]
            return JudgeResult.failed(FailureReason.INTERNAL_ERROR, f"embedding: {type(e).__name__}: {e}",
                                      raw=call.raw, details=details, calls=calls)
        details["generated_questions"] = [{"question": q, "similarity": s} for q, s in zip(generated, sims)]
        score = sum(sims) / len(sims)
        rationale = f"Mean cosine similarity {score:.3f} between the question and {len(sims)} questions "
        rationale += "the response answers: " + "; ".join(f"\"{q}\" ({s:.2f})" for q, s in zip(generated, sims)) + "."
        return JudgeResult.scored(score, rationale, raw=call.raw, details=details, calls=calls)

    def _embedder_languages(self) -> tuple[str, ...] | None:
        owner = getattr(self.embed, "__self__", None)  # a bound method of the embedder (the local MiniLM's)
        langs = getattr(owner, "languages", None) or getattr(self.embed, "languages", None)
        return tuple(langs) if langs else None

    def _embedder_name(self) -> str:
        owner = getattr(self.embed, "__self__", None)
        return type(owner).__name__ if owner is not None else getattr(self.embed, "__name__", "embed")

    def _unsupported_language(self, question: str, response: str) -> str | None:
        """The language of a row an English-only embedder cannot compare (the run's ``language``; text that is
        mostly in a script other than Latin: Japanese, Chinese, Korean, Cyrillic, Arabic ...; or text in Latin
        letters whose function words are French, German, Spanish, Italian, Portuguese or Dutch); None when the
        embedder is not known to be English-only."""
        langs = self._embedder_languages()
        if not langs or "en" not in langs or len(langs) > 1:
            return None
        if self.language not in langs:
            return f"language {self.language!r} (the run's language setting)"
        script = non_latin_script(f"{question} {response}")
        if script:
            return f"a non-Latin script ({script})"
        language = latin_language(f"{question} {response}")
        if language == UNIDENTIFIED_LANGUAGE:
            return language
        return f"{language}, not English" if language else None

    def estimate(self, question: str, response: str) -> Estimate:
        """Upper-bound cost of one row without calling the model: 1 chat call (0 for an empty
        response). The embedding request (``n + 1`` short texts) is not counted."""
        if not (response or "").strip():
            return {"calls": 0, "input_tokens": 0, "output_tokens": 0}
        return estimate_messages(self._messages(response), min(self.max_tokens, 16 + 40 * self.n))


# --------------------------------------------------------------------------- the metric


def _questions_column(res: dict[str, JudgeResult]) -> Any:
    d = res["answer_relevancy"].details
    return json.dumps(d["generated_questions"], ensure_ascii=False) if "generated_questions" in d else None


def _setup(ctx: RunContext) -> AnswerRelevancyJudge:
    assert ctx.embed is not None  # needs_embeddings: the engine resolved them (or skipped this metric)
    return AnswerRelevancyJudge(ctx.judge_client, embed=ctx.embed, n=N_QUESTIONS.read(ctx.cfg),
                                language=ctx.cfg.language)


#: answer relevancy's own setting
#: questions generated per response
N_QUESTIONS = Option("answer_relevancy_n", 3, lambda v: is_int(v) and v >= 1,
                     "a whole number >= 1 (questions generated per response)", "3")


def _spec() -> MetricSpec[AnswerRelevancyJudge]:
    return MetricSpec(
        "answer_relevancy",
        options=(N_QUESTIONS,),
        requires=(("question", "answer"),),
        judged=True,
        needs=Needs(embeddings=True),
        setup=_setup,
        score=lambda j, r, ctx: j.judge(r.question or "", r.answer or ""),
        estimate=lambda j, r, ctx: j.estimate(r.question or "", r.answer or ""),
        outputs=Outputs(columns={"answer_relevancy/generated_questions": _questions_column}),
        prompt_versions=lambda j: j.prompt_versions,
        description="answer relevancy: mean cosine similarity of questions generated from the response to the question",
        offline="it needs a language model to write the questions the response answers",
    )


METRICS = (_spec(),)
