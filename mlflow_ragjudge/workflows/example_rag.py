"""The bundled example RAG system: a small, transparent pipeline to sweep, over the bundled Db2 sample.

``answer(question, **params)`` is a pipeline in the form :func:`mlflow_ragjudge.sweep` takes::

    import mlflow_ragjudge as rj
    from mlflow_ragjudge.workflows import example_rag

    rj.sweep(example_rag.answer, {"chunk_size": [16, 64], "top_k": [1, 3]}, example_rag.sample_questions(),
             retriever=example_rag.retrieve, evaluator_config={"judge": "offline:/lexical"})

Its stages, each a parameter of ``answer``:

* **chunking** -- windows of ``chunk_size`` tokens overlapping by ``overlap`` (default a quarter); a token is a
  whitespace word, or one CJK character; a chunk's text is the exact span of its document;
* **retrieval** -- Okapi BM25 (``k1`` 1.5, ``b`` 0.75, the non-negative idf ``ln(1 + (N - df + 0.5) / (df +
  0.5))``) over the chunks, ``top_k`` best;
* **reranking** -- ``reranker="coverage"`` reorders BM25's ten best by the share of the question's terms a chunk
  holds (BM25 breaks ties): a transparent stand-in for a learned reranker;
* **generation** -- ``generator="extractive"`` (default) is **not a language model**: it answers with the
  context sentence(s) that share the most terms with the question, or ``NOT_FOUND`` when no sentence covers
  half of them. Any model URI (``openai:/gpt-4o-mini``, ``ollama:/llama3.1``, ...) generates instead, from
  ``prompt``: a template with ``{{question}}`` and ``{{contexts}}`` (numbered passages, each with its document
  id), sent through :class:`mlflow_ragjudge.JudgeClient` (its cache, retries and limits).

It returns ``answer``, ``contexts`` (the chunks given to the generator), ``retrieved_doc_ids`` (their
documents, best first) and ``citations`` (the documents of the sentences the extractive generator used; for a
model, the ``[doc id]`` markers its answer carries).
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.text import split_sentences
from ..llm.backends import ChatRequest
from ..llm.client import JudgeClient

__all__ = ["answer", "retrieve", "sample_questions", "sample_corpus", "NOT_FOUND", "DEFAULT_PROMPT",
           "chunk_documents", "BM25Index", "Chunk"]

NOT_FOUND = "The documents do not contain the answer."
DEFAULT_PROMPT = (
    "Answer the question using only the numbered context passages. If they do not contain the answer, reply "
    f"exactly: {NOT_FOUND}\nCite the passages you used by their document id in square brackets, e.g. [d1].\n\n"
    "Context:\n{{contexts}}\n\nQuestion: {{question}}\nAnswer:"
)

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
_TOKEN = re.compile(rf"[{_CJK}]|[^\s{_CJK}]+")
_WORD = re.compile(r"[a-z0-9]+(?:['.][a-z0-9]+)*")
_CJK_RUN = re.compile(rf"[{_CJK}]+")
_STOP = frozenset("""a an and are as at be been but by can could did do does for from had has have how i if in into is
    it its me my not of on or our should so than that the their them then there these they this those to was we
    were what when where which who why will with would you your about also between""".split())


def _plural(word: str) -> str:
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("xes", "ches", "shes", "sses")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def terms(text: str) -> list[str]:
    """Search terms: lower-cased words with plurals folded, stop words dropped; CJK text as character bigrams."""
    low = text.lower()
    out = [_plural(w) for w in _WORD.findall(low) if w not in _STOP]
    for run in _CJK_RUN.findall(low):
        out.extend([run] if len(run) == 1 else [run[i: i + 2] for i in range(len(run) - 1)])
    return out


@dataclass(frozen=True)
class Chunk:
    """A window of a document: ``chunk_id`` is ``<doc_id>#<n>``."""

    chunk_id: str
    doc_id: str
    text: str


def chunk_documents(docs: Mapping[str, str], chunk_size: int, overlap: int) -> list[Chunk]:
    """Windows of ``chunk_size`` tokens, consecutive ones sharing ``overlap`` tokens (stride ``chunk_size -
    overlap``); the last window ends at the document's last token.

    Raises:
        ValueError: ``chunk_size < 1`` or ``overlap`` outside ``[0, chunk_size)``.
    """
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size!r} must be a whole number of tokens >= 1")
    if not isinstance(overlap, int) or isinstance(overlap, bool) or not 0 <= overlap < chunk_size:
        raise ValueError(f"overlap={overlap!r} must be a whole number in [0, chunk_size={chunk_size})")
    out: list[Chunk] = []
    for doc_id, text in docs.items():
        spans = [m.span() for m in _TOKEN.finditer(text)]
        start, n = 0, 0
        while spans:
            end = min(start + chunk_size, len(spans))
            out.append(Chunk(f"{doc_id}#{n}", doc_id, text[spans[start][0]: spans[end - 1][1]]))
            if end >= len(spans):
                break
            start += chunk_size - overlap
            n += 1
    return out


class BM25Index:
    """Okapi BM25 over chunks (formula in the module docstring); ties keep corpus order."""

    def __init__(self, chunks: Sequence[Chunk], k1: float = 1.5, b: float = 0.75) -> None:
        self.chunks = list(chunks)
        self.k1, self.b = k1, b
        self._tf = [Counter(terms(c.text)) for c in self.chunks]
        self._len = [sum(tf.values()) for tf in self._tf]
        self._avg = sum(self._len) / len(self._len) if self._len else 0.0
        df: Counter[str] = Counter()
        for tf in self._tf:
            df.update(tf.keys())
        n = len(self.chunks)
        self.idf = {t: math.log(1 + (n - d + 0.5) / (d + 0.5)) for t, d in df.items()}

    def search(self, query: str, k: int) -> list[tuple[Chunk, float]]:
        q = terms(query)
        scored = []
        for chunk, tf, dl in zip(self.chunks, self._tf, self._len):
            norm = self.k1 * (1 - self.b + self.b * dl / self._avg) if self._avg else self.k1
            s = sum(self.idf[t] * tf[t] * (self.k1 + 1) / (tf[t] + norm) for t in q if tf.get(t))
            if s > 0:
                scored.append((chunk, s))
        scored.sort(key=lambda cs: -cs[1])
        return scored[:k]


def _coverage(query: str, text: str) -> float:
    q = set(terms(query))
    return len(q & set(terms(text))) / len(q) if q else 0.0


@functools.cache
def sample_corpus() -> dict[str, str]:
    """The bundled corpus ``data/sample_corpus.json``: 32 short Db2 documents, ``doc_id -> text``."""
    text = (resources.files("mlflow_ragjudge") / "data" / "sample_corpus.json").read_text(encoding="utf-8")
    return dict(json.loads(text))


def sample_questions() -> pd.DataFrame:
    """The bundled questions (``data/sample_questions.jsonl``): 40 questions over the bundled corpus, with
    ``question``, ``reference``, ``relevant_doc_ids`` and ``group`` -- enough for a calibrated interval (30 labels
    per variant) and a paired comparison with some power. A pipeline makes its own answers, contexts and ids.
    (``data/sample_rag.jsonl`` holds the first 8 with one system's recorded outputs, for the benchmarks.)"""
    with resources.as_file(resources.files("mlflow_ragjudge") / "data" / "sample_questions.jsonl") as p:
        df = pd.read_json(p, lines=True, dtype=False)
    df = df[["question", "reference", "relevant_doc_ids", "group"]].copy()
    df.attrs["name"] = "ragjudge-sample"
    return df


@functools.lru_cache(maxsize=64)
def _index(corpus_key: str, chunk_size: int, overlap: int) -> BM25Index:
    docs = sample_corpus() if corpus_key == "sample" else _read_corpus(corpus_key)
    return BM25Index(chunk_documents(docs, chunk_size, overlap))


@functools.cache
def _read_corpus(path: str) -> dict[str, str]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ValueError(f"corpus {path!r} must be a JSON object {{doc_id: text}}")
    return {str(k): v for k, v in data.items()}


def _retrieve(question: str, chunk_size: int, overlap: int | None, top_k: int, reranker: str | bool,
              corpus: str | None) -> list[Chunk]:
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise ValueError(f"top_k={top_k!r} must be a whole number >= 1")
    rerank = {"off": False, "none": False, "coverage": True, "on": True}.get(str(reranker).lower()) \
        if not isinstance(reranker, bool) else reranker
    if rerank is None:
        raise ValueError(f"reranker={reranker!r}: use 'off' or 'coverage'")
    index = _index(corpus or "sample", chunk_size, chunk_size // 4 if overlap is None else overlap)
    if not rerank:
        return [c for c, _ in index.search(question, top_k)]
    pool = index.search(question, max(top_k, 10))
    return [c for c, _ in sorted(pool, key=lambda cs: (-_coverage(question, cs[0].text), -cs[1]))[:top_k]]


def retrieve(query: str, *, chunk_size: int = 64, overlap: int | None = None, top_k: int = 3,
             reranker: str | bool = "off", corpus: str | None = None, **_: Any) -> list[str]:
    """``query -> passages`` with a variant's retrieval settings (other parameters ignored): the E3 retriever
    a sweep calls with question + reference answer (``sweep(..., retriever=example_rag.retrieve)``)."""
    return [c.text for c in _retrieve(query, chunk_size, overlap, top_k, reranker, corpus)]


_SENTENCE_END = (".", "!", "?", "…", "。", "！", "？", ":", ";")


def _extract(question: str, chunks: Sequence[Chunk], min_coverage: float = 0.5,
             max_sentences: int = 2) -> tuple[str, list[str]]:
    q = set(terms(question))
    cands: list[tuple[float, int, str, set[str], str]] = []
    for chunk in chunks:
        for sent in split_sentences(chunk.text):
            hit = set(terms(sent)) & q
            cands.append((len(hit) / len(q) if q else 0.0, len(cands), sent, hit, chunk.doc_id))
    texts = {c[2] for c in cands}  # a fragment cut by a chunk boundary yields to its complete copy
    cands = [c for c in cands if not any(c[2] != t and c[2] in t for t in texts)]
    cands.sort(key=lambda c: (-c[0], c[1]))
    if not cands or cands[0][0] < min_coverage:
        return NOT_FOUND, []
    chosen = [cands[0]]
    covered = set(cands[0][3])
    for c in cands[1:]:
        if len(chosen) >= max_sentences:
            break
        if c[0] >= min_coverage and c[3] - covered and c[2] not in chosen[0][2] and chosen[0][2] not in c[2]:
            chosen.append(c)
            covered |= c[3]
    chosen.sort(key=lambda c: c[1])
    # a sentence a chunk boundary cut ends in "…", and the next piece starts a line: fragments run together would
    # read as one sentence that no document says
    text = chosen[0][2]
    for c in chosen[1:]:
        whole = text.rstrip().endswith(_SENTENCE_END) and not c[2][:1].islower()
        text = text + " " + c[2] if whole else text.rstrip() + ("" if text.rstrip().endswith(_SENTENCE_END) else "…") \
            + "\n" + c[2]
    return text, list(dict.fromkeys(c[4] for c in chosen))


@functools.lru_cache(maxsize=16)
def _client(uri: str) -> Any:
    return JudgeClient(uri)


def _generate(uri: str, prompt: str, question: str, chunks: Sequence[Chunk]) -> tuple[str, list[str]]:
    passages = "\n".join(f"[{c.doc_id}] {' '.join(c.text.split())}" for c in chunks) or "(no passages)"
    text = prompt.replace("{{contexts}}", passages).replace("{{question}}", question)
    call = _client(uri).call(ChatRequest.of([{"role": "user", "content": text}], max_tokens=512),
                             purpose="generate")
    if not call.ok:
        raise RuntimeError(f"the generator {uri} failed: {call.error}")
    reply = (call.raw or "").strip()
    ids = {c.doc_id for c in chunks}
    return reply, list(dict.fromkeys(m for m in re.findall(r"\[([^\[\]\s]+)\]", reply) if m in ids))


def answer(question: str, *, chunk_size: int = 64, overlap: int | None = None, top_k: int = 3,
           reranker: str | bool = "off", generator: str = "extractive", prompt: str | None = None,
           corpus: str | None = None) -> dict[str, Any]:
    """Answer ``question`` with one variant of the example system (parameters in the module docstring;
    ``corpus``: a JSON file ``{doc_id: text}`` instead of the bundled sample).

    Returns:
        ``{"answer", "contexts", "retrieved_doc_ids", "citations"}``.
    """
    chunks = _retrieve(question, chunk_size, overlap, top_k, reranker, corpus)
    if generator == "extractive":
        text, cited = _extract(question, chunks)
    else:
        text, cited = _generate(generator, prompt or DEFAULT_PROMPT, question, chunks)
    return {"answer": text, "contexts": [c.text for c in chunks],
            "retrieved_doc_ids": list(dict.fromkeys(c.doc_id for c in chunks)), "citations": cited}
