"""A small, honest RAG system in pure Python: chunking, BM25, an optional reranker, a generator.

* :func:`chunk_documents` - windows of ``chunk_size`` tokens (see :mod:`experiments.text_utils` for the token
  rule) that overlap by ``overlap`` tokens; a chunk's text is the exact span of the source document.
* :class:`BM25Index` - Okapi BM25 (Robertson & Zaragoza 2009) over chunks, written here, no IR library.
* :class:`CoverageReranker` - reorders BM25's candidates by the share of the query's terms a chunk contains
  (BM25 score breaks ties): rewards chunks that cover the whole question over chunks that repeat one term.
* Generators: :class:`LLMGenerator` (any judge URI through :class:`mlflow_ragjudge.JudgeClient`, with one of
  the prompt styles of :mod:`experiments.rag_prompts`) and :class:`ExtractiveGenerator`, an OFFLINE STAND-IN
  that is not a language model: it returns the context sentence(s) that share the most terms with the
  question, or a fixed not-found phrase when none shares enough.
* :class:`ToyRAG` ties them together; :meth:`ToyRAG.answer` returns the ``answer``, ``contexts`` and
  ``retrieved_doc_ids`` columns that the ``ragjudge`` evaluator reads, and the pipeline is itself the
  ``query -> passages`` retriever for E3 (``evaluator_config={"retriever": rag.retrieve_texts}``).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Protocol

import pandas as pd

from experiments.contract import (
    CONTRACT_JSON_SCHEMA,
    NOT_FOUND,
    ContextDoc,
    check_output,
    lenient_answer,
    validate_input,
)
from experiments.rag_prompts import STYLES, prompt_version, render
from experiments.text_utils import content_terms, token_spans
from mlflow_ragjudge import JudgeClient
from mlflow_ragjudge.backends import Backend, ChatRequest, JsonSchema
from mlflow_ragjudge.text import split_sentences

__all__ = [
    "BM25Index",
    "Chunk",
    "CoverageReranker",
    "Document",
    "ExtractiveGenerator",
    "Generator",
    "LLMGenerator",
    "RAGOutput",
    "Retrieved",
    "ToyRAG",
    "chunk_documents",
    "load_sample_corpus",
    "load_sample_questions",
]


@dataclass(frozen=True)
class Document:
    doc_id: str
    text: str


@dataclass(frozen=True)
class Chunk:
    """A window of a document: ``chunk_id`` is ``<doc_id>#<n>``; ``start``/``end`` are token positions."""

    chunk_id: str
    doc_id: str
    text: str
    start: int
    end: int


def chunk_documents(docs: Iterable[Document], chunk_size: int, overlap: int = 0) -> list[Chunk]:
    """Split documents into windows of ``chunk_size`` tokens, consecutive windows sharing ``overlap`` tokens.

    The stride is ``chunk_size - overlap``; the last window of a document ends at its last token (a document
    no longer than ``chunk_size`` is one chunk). Chunk text is the original text between the first and the
    last token of the window, spacing and punctuation kept.

    Raises:
        ValueError: ``chunk_size < 1`` or ``overlap`` not in ``[0, chunk_size)``.
    """
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size!r} must be a whole number of tokens >= 1.")
    if not isinstance(overlap, int) or not 0 <= overlap < chunk_size:
        raise ValueError(f"overlap={overlap!r} must be a whole number in [0, chunk_size={chunk_size}).")
    stride = chunk_size - overlap
    out: list[Chunk] = []
    for doc in docs:
        spans = token_spans(doc.text)
        if not spans:
            continue
        start, n = 0, 0
        while True:
            end = min(start + chunk_size, len(spans))
            text = doc.text[spans[start][0] : spans[end - 1][1]]
            out.append(Chunk(f"{doc.doc_id}#{n}", doc.doc_id, text, start, end))
            if end >= len(spans):
                break
            start += stride
            n += 1
    return out


class BM25Index:
    """Okapi BM25 over chunks.

    ``score(q, c) = sum_{t in q} idf(t) * tf(t, c) * (k1 + 1) / (tf(t, c) + k1 * (1 - b + b * |c| / avgdl))``
    with ``idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))`` (the non-negative form used by Lucene);
    ``|c|`` is the chunk's number of content terms, ``avgdl`` the mean over chunks; a query term counts once
    per occurrence in the query. Only chunks with a positive score are returned.
    """

    def __init__(self, chunks: Sequence[Chunk], k1: float = 1.5, b: float = 0.75) -> None:
        if k1 < 0 or not 0 <= b <= 1:
            raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}.")
        self.chunks = list(chunks)
        self.k1, self.b = k1, b
        self._tf = [Counter(content_terms(c.text)) for c in self.chunks]
        self._len = [sum(tf.values()) for tf in self._tf]
        self._avgdl = (sum(self._len) / len(self._len)) if self._len else 0.0
        df: Counter[str] = Counter()
        for tf in self._tf:
            df.update(tf.keys())
        n = len(self.chunks)
        self.idf = {t: math.log(1 + (n - d + 0.5) / (d + 0.5)) for t, d in df.items()}

    def scores(self, query: str) -> list[float]:
        q = content_terms(query)
        out = []
        for tf, dl in zip(self._tf, self._len):
            norm = self.k1 * (1 - self.b + self.b * dl / self._avgdl) if self._avgdl else self.k1
            s = 0.0
            for t in q:
                f = tf.get(t, 0)
                if f:
                    s += self.idf[t] * f * (self.k1 + 1) / (f + norm)
            out.append(s)
        return out

    def search(self, query: str, k: int) -> list[tuple[Chunk, float]]:
        """The ``k`` best chunks with their scores, best first; ties keep corpus order."""
        scored = [(c, s) for c, s in zip(self.chunks, self.scores(query)) if s > 0]
        scored.sort(key=lambda cs: -cs[1])  # stable: ties keep corpus order
        return scored[:k]


class CoverageReranker:
    """Reorder candidates by query-term coverage: distinct query terms present in the chunk / distinct query terms.

    ``candidates`` is how many BM25 results it reorders (at least ``top_k``). Not a learned reranker: a
    transparent stand-in for one, to show what a reranking stage does to the metrics.
    """

    name = "coverage"

    def __init__(self, candidates: int = 10) -> None:
        self.candidates = candidates

    @staticmethod
    def coverage(query: str, text: str) -> float:
        q = set(content_terms(query))
        return len(q & set(content_terms(text))) / len(q) if q else 0.0

    def rerank(self, query: str, hits: list[tuple[Chunk, float]]) -> list[tuple[Chunk, float]]:
        return sorted(hits, key=lambda cs: (-self.coverage(query, cs[0].text), -cs[1]))


@dataclass
class Retrieved:
    chunks: list[Chunk]
    scores: list[float]

    @property
    def texts(self) -> list[str]:
        return [c.text for c in self.chunks]

    @property
    def doc_ids(self) -> list[str]:
        """Distinct source-document ids in rank order (a document is listed at its best chunk's rank)."""
        return list(dict.fromkeys(c.doc_id for c in self.chunks))


class Generator(Protocol):
    name: str

    def generate(self, question: str, contexts: Sequence[ContextDoc], language: str = "en") -> GenerationOutcome: ...


@dataclass
class GenerationOutcome:
    answer: str
    raw: str = ""
    format_ok: bool | None = None  # None: the generator has no output contract (extractive)
    violations: list[str] = field(default_factory=list)
    error: str = ""


class ExtractiveGenerator:
    """OFFLINE STAND-IN generator, not a language model.

    Splits the contexts into sentences and scores each by the share of the question's distinct content terms
    it contains. Returns the best sentence, plus the next best when it covers question terms the first does not;
    when no sentence covers at least ``min_coverage`` of the question, returns the fixed not-found phrase.
    Ties go to the sentence from the higher-ranked context. A sentence contained in another (a fragment cut
    by a chunk boundary, whose complete copy is in the overlapping chunk) is dropped. A second sentence that
    shares a three-word run with the first is skipped, and one that starts with the words the first ends with
    (two fragments of overlapping chunks) is stitched on without repeating them. Its answers are copies of
    context text, so its faithfulness is trivially high and its correctness mostly measures retrieval.
    """

    name = "extractive"

    def __init__(self, min_coverage: float = 0.5, max_sentences: int = 2) -> None:
        if not 0 < min_coverage <= 1:
            raise ValueError(f"min_coverage={min_coverage} must be in (0, 1].")
        self.min_coverage = min_coverage
        self.max_sentences = max_sentences

    def generate(self, question: str, contexts: Sequence[ContextDoc], language: str = "en") -> GenerationOutcome:
        q = set(content_terms(question))
        candidates: list[tuple[float, int, str, set[str]]] = []
        order = 0
        for ctx in contexts:
            for sent in split_sentences(ctx.text):
                terms = set(content_terms(sent)) & q
                candidates.append((len(terms) / len(q) if q else 0.0, order, sent, terms))
                order += 1
        texts = {c[2] for c in candidates}  # a fragment of an overlapping chunk yields to its complete copy
        candidates = [c for c in candidates if not any(c[2] != t and c[2] in t for t in texts)]
        candidates.sort(key=lambda c: (-c[0], c[1]))
        if not candidates or candidates[0][0] < self.min_coverage:
            return GenerationOutcome(NOT_FOUND[language])
        chosen = [candidates[0]]
        covered = set(candidates[0][3])
        for cand in candidates[1:]:
            if len(chosen) >= self.max_sentences:
                break
            if cand[0] >= self.min_coverage and cand[3] - covered and not _overlaps(cand[2], chosen[0][2]):
                chosen.append(cand)
                covered |= cand[3]
        answer = ""
        for c in sorted(chosen, key=lambda c: c[1]):
            answer = _stitch(answer, c[2])
        return GenerationOutcome(answer)


def _overlaps(a: str, b: str, n: int = 3) -> bool:
    """True when ``a`` and ``b`` share a run of ``n`` words (overlapping chunks of one document)."""
    wa, wb = a.lower().split(), b.lower().split()
    grams = {tuple(wa[i : i + n]) for i in range(len(wa) - n + 1)}
    return any(tuple(wb[i : i + n]) in grams for i in range(len(wb) - n + 1)) or a in b or b in a


def _stitch(a: str, b: str) -> str:
    """Join two sentences; when ``b`` starts with the words ``a`` ends with (overlapping chunks), once."""
    if not a:
        return b
    wa, wb = a.split(), b.split()
    for k in range(min(len(wa), len(wb)) - 1, 0, -1):
        if wa[-k:] == wb[:k]:
            return " ".join([a, *wb[k:]])
    return f"{a} {b}"


class LLMGenerator:
    """An LLM generator: renders a prompt style, calls the model through :class:`JudgeClient`, checks the reply.

    Args:
        model: a model URI (``openai:/gpt-4o-mini``, ``ollama:/llama3.1``) or a Backend object.
        style: one of :data:`experiments.rag_prompts.STYLES`.
        structured: ask for the contract's JSON schema (constrained decoding where the provider has it);
            not for ``cot``, whose reasoning is free text.
        cache: the client's call cache (see :class:`JudgeClient`).
    """

    def __init__(
        self, model: str | Backend, style: str = "zero_shot", *, structured: bool = False, cache: bool | str = True
    ) -> None:
        if style not in STYLES:
            raise ValueError(f"Unknown prompt style {style!r}; use one of {', '.join(STYLES)}.")
        if structured and style == "cot":
            raise ValueError("structured=True constrains the whole reply to JSON; the 'cot' style writes reasoning.")
        self.client = JudgeClient(model, cache=cache)
        self.style = style
        self.structured = structured
        self.version = prompt_version(style)
        self.name = f"{self.client.backend.uri}|{style}"

    def generate(self, question: str, contexts: Sequence[ContextDoc], language: str = "en") -> GenerationOutcome:
        inp = validate_input(question, list(contexts), language)
        schema = JsonSchema("rag_answer", CONTRACT_JSON_SCHEMA) if self.structured else None
        request = ChatRequest.of(render(self.style, inp), json_schema=schema, max_tokens=1024)
        result = self.client.call(request, prompt_version=self.version, purpose=f"generate:{self.style}")
        if not result.ok:
            return GenerationOutcome("", raw=result.raw or "", format_ok=False, error=result.error)
        raw = result.raw or ""
        check = check_output(raw, [c.doc_id for c in inp.contexts], cot=self.style == "cot")
        return GenerationOutcome(lenient_answer(check), raw=raw, format_ok=check.ok, violations=check.messages())


@dataclass
class RAGOutput:
    """One answered question: exactly the columns the ``ragjudge`` evaluator reads, plus diagnostics."""

    question: str
    answer: str
    contexts: list[str]
    retrieved_doc_ids: list[str]
    chunk_ids: list[str]
    scores: list[float]
    raw: str = ""
    format_ok: bool | None = None
    violations: list[str] = field(default_factory=list)
    error: str = ""


class ToyRAG:
    """Chunk -> BM25 top-k (-> coverage rerank) -> generate.

    Args:
        docs: the corpus (``Document``s, or a mapping ``doc_id -> text``).
        chunk_size, overlap: chunking, in tokens.
        top_k: chunks given to the generator (and to the judge in E3).
        reranker: a :class:`CoverageReranker`, or None.
        generator: an :class:`ExtractiveGenerator` (default) or an :class:`LLMGenerator`.
        k1, b: BM25 parameters.
    """

    def __init__(
        self,
        docs: Iterable[Document] | Mapping[str, str],
        *,
        chunk_size: int = 64,
        overlap: int = 0,
        top_k: int = 3,
        reranker: CoverageReranker | None = None,
        generator: Generator | None = None,
        k1: float = 1.5,
        b: float = 0.75,
        language: str = "en",
    ) -> None:
        if isinstance(docs, Mapping):
            docs = [Document(str(k), str(v)) for k, v in docs.items()]
        if not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k={top_k!r} must be a whole number >= 1.")
        self.docs = list(docs)
        self.chunks = chunk_documents(self.docs, chunk_size, overlap)
        self.index = BM25Index(self.chunks, k1=k1, b=b)
        self.chunk_size, self.overlap, self.top_k = chunk_size, overlap, top_k
        self.reranker = reranker
        self.generator: Generator = generator or ExtractiveGenerator()
        self.language = language

    def retrieve(self, query: str) -> Retrieved:
        if self.reranker is None:
            hits = self.index.search(query, self.top_k)
        else:
            pool = self.index.search(query, max(self.top_k, self.reranker.candidates))
            hits = self.reranker.rerank(query, pool)[: self.top_k]
        return Retrieved([c for c, _ in hits], [s for _, s in hits])

    def retrieve_texts(self, query: str) -> list[str]:
        """``query -> passages``: the E3 retriever the ``ragjudge`` evaluator calls with question + reference."""
        return self.retrieve(query).texts

    def answer(self, question: str) -> RAGOutput:
        got = self.retrieve(question)
        ctx = [ContextDoc(c.chunk_id, c.text, s) for c, s in zip(got.chunks, got.scores)]
        gen = self.generator.generate(question, ctx, self.language)
        return RAGOutput(
            question=question,
            answer=gen.answer,
            contexts=got.texts,
            retrieved_doc_ids=got.doc_ids,
            chunk_ids=[c.chunk_id for c in got.chunks],
            scores=[round(s, 4) for s in got.scores],
            raw=gen.raw,
            format_ok=gen.format_ok,
            violations=gen.violations,
            error=gen.error,
        )

    def run(self, questions: pd.DataFrame, *, fail_fast: bool = True) -> pd.DataFrame:
        """Answer every ``question`` of a frame; returns the frame with ``answer``, ``contexts``,
        ``retrieved_doc_ids`` filled in by this system (and ``chunk_ids``, ``format_ok``, ``generation_error``).

        Raises:
            RuntimeError: with ``fail_fast``, when the first question's generation fails (a wrong model URI, a
                server that is down), rather than waiting out the retries of every other question.
        """
        outs: list[RAGOutput] = []
        for q in questions["question"]:
            outs.append(self.answer(q))
            if fail_fast and len(outs) == 1 and outs[0].error:
                raise RuntimeError(f"The generator failed on the first question ({q!r}): {outs[0].error}")
        df = questions.copy()
        df["answer"] = [o.answer for o in outs]
        df["contexts"] = [o.contexts for o in outs]
        df["retrieved_doc_ids"] = [o.retrieved_doc_ids for o in outs]
        df["chunk_ids"] = [o.chunk_ids for o in outs]
        df["format_ok"] = [o.format_ok for o in outs]
        df["generation_error"] = [o.error for o in outs]
        return df


# --------------------------------------------------------------------------- bundled sample data


def load_sample_corpus() -> list[Document]:
    """The package's bundled corpus ``mlflow_ragjudge/data/sample_corpus.json`` (10 short Db2 documents)."""
    with resources.as_file(resources.files("mlflow_ragjudge") / "data" / "sample_corpus.json") as p:
        data = json.loads(Path(p).read_text(encoding="utf-8"))
    return [Document(k, v) for k, v in data.items()]


def load_sample_questions() -> pd.DataFrame:
    """The bundled questions ``sample_rag.jsonl``: question, reference, relevant_doc_ids, group.

    The file's own answer/contexts/retrieved_doc_ids (from some other system) are dropped: the toy RAG
    produces its own.
    """
    with resources.as_file(resources.files("mlflow_ragjudge") / "data" / "sample_rag.jsonl") as p:
        df = pd.read_json(p, lines=True, dtype=False)
    return df[["question", "reference", "relevant_doc_ids", "group"]].copy()
