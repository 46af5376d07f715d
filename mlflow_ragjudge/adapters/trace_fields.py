"""The question, the answer and the retrieved documents of whatever an app logged: the ``inputs`` / ``outputs`` an
``mlflow.genai`` scorer is given and the trace behind them.

Apps log their calls in many shapes, and ``mlflow.genai.evaluate(data=mlflow.search_traces(...))`` hands a scorer the
root span's inputs and outputs as they were logged:

* chat APIs (OpenAI chat completions, Anthropic messages, a LangChain chat model, an agent's ``messages``): the
  question is the **last user turn** of ``messages``; the answer is the completion's first choice, the Anthropic
  message's text blocks, or the last assistant message;
* the OpenAI Responses API: ``input`` (a string, or messages) and the ``output`` items' ``output_text`` parts;
* LangChain chains and LlamaIndex query engines: the chain's input (a string, or a dict such as ``{"question": ...}``;
  LlamaIndex's ``str_or_query_bundle``) and its output (a string, an ``AIMessage``, a ``Response`` with ``response``);
* plain ``@mlflow.trace`` functions: their arguments by name (``{"question": ...}``, ``{"q": ..., "k": 3}``) and
  their return value.

The answer is read with MLflow's own parser where it knows the shape (``parse_outputs_to_str``: chat choices, chat
messages, the Responses API), then by the rules here for the shapes it does not read (Anthropic's content blocks,
LangChain's generations, dict keys). MLflow has no parser for a question that keeps a conversation's last user turn
(``parse_inputs_to_str`` gives the whole conversation as JSON), so the question is read here.

The documents are those of the trace's **RETRIEVER spans, wherever they are in the tree**: a retriever nested in
another retriever is part of it (the outer one's output counts), and when several retrievers ran, all of them count
by default (documents de-duplicated, in the order the spans started) -- or the ones ``retriever_spans`` names
(``"last"``, ``"first"``, or span names). Which spans were read is kept with the result. A document's id is its
metadata's ``doc_uri`` (MLflow's convention), else its ``id`` (LangChain, LlamaIndex), else the metadata's ``id`` /
``doc_id`` / ``document_id`` / ``chunk_id`` / ``node_id`` / ``source``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mlflow.genai.utils.trace_utils import parse_outputs_to_str

#: keys whose text value is the question, in the order they are tried
QUESTION_KEYS = ("question", "query", "user_question", "user_query", "user_input", "input", "inputs", "request",
                 "prompt", "query_str", "str_or_query_bundle", "message", "text", "q")
#: keys whose text value is the answer, in the order they are tried
ANSWER_KEYS = ("answer", "response", "output", "outputs", "output_text", "result", "completion", "generation",
               "content", "text", "final_answer")
#: message roles (OpenAI, Anthropic) and LangChain message types that are the user's turn
_USER = ("user", "human")
_ASSISTANT = ("assistant", "ai", "model")
#: text parts of a message's content (OpenAI chat, Responses API, Anthropic)
_TEXT_PARTS = ("text", "input_text", "output_text")
#: where a document's id is looked for in its metadata, after ``doc_uri`` and the document's own ``id``
_ID_KEYS = ("id", "doc_id", "document_id", "chunk_id", "node_id", "source")
_CONTENT_KEYS = ("page_content", "content", "text")
_DEPTH = 4  # how far into nested containers a question or answer is looked for


def _plain(value: Any) -> Any:
    """Objects as logged values: pydantic models and SDK objects (``model_dump`` / ``to_dict``) as dicts."""
    if value is None or isinstance(value, (str, int, float, bool, dict, list, tuple)):
        return value
    for attr in ("model_dump", "to_dict", "dict"):
        fn = getattr(value, attr, None)
        if callable(fn):
            try:
                out = fn()
            except Exception:  # an object whose dump needs arguments: not a logged value
                continue
            if isinstance(out, dict):
                return out
    return value


def _text_of_content(content: Any) -> str | None:
    """A message's content as text: a string, or the text of its parts (``{"type": "text", "text": ...}``)."""
    content = _plain(content)
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if isinstance(content, (list, tuple)):
        texts = []
        for part in content:
            part = _plain(part)
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type", "text") in _TEXT_PARTS and isinstance(part.get("text"),
                                                                                                   str):
                texts.append(part["text"])
        return "\n".join(texts) if texts else None
    return None


def _role(message: dict[str, Any]) -> str | None:
    role = message.get("role", message.get("type"))
    return str(role).lower() if role is not None else None


def _is_messages(value: Any) -> bool:
    """A non-empty list of chat messages: dicts with a ``role`` (or LangChain's ``type``) and ``content`` (or
    LlamaIndex's ``blocks``)."""
    return (isinstance(value, (list, tuple)) and bool(value)
            and all(isinstance(_plain(m), dict) for m in value)
            and any(("content" in _plain(m) or "blocks" in _plain(m)) and _role(_plain(m)) is not None
                    for m in value))


def _message_text(message: dict[str, Any]) -> str | None:
    if "content" in message:
        return _text_of_content(message.get("content"))
    blocks = message.get("blocks")  # LlamaIndex: [{"block_type": "text", "text": ...}]
    if isinstance(blocks, list):
        texts = [b["text"] for b in blocks if isinstance(b, dict) and b.get("block_type", "text") == "text"
                 and isinstance(b.get("text"), str)]
        return "\n".join(texts) if texts else None
    return None


def last_user_turn(messages: Sequence[Any]) -> str | None:
    """The text of the last user (``human``) message of a conversation; None when it has none."""
    for m in reversed(list(messages)):
        m = _plain(m)
        if isinstance(m, dict) and _role(m) in _USER:
            text = _message_text(m)
            if text is not None:
                return text
    return None


def _last_assistant_turn(messages: Sequence[Any]) -> str | None:
    for m in reversed(list(messages)):
        m = _plain(m)
        if isinstance(m, dict) and _role(m) in _ASSISTANT:
            text = _message_text(m)
            if text:
                return text
    return None


def question_of(inputs: Any, _depth: int = 0) -> str | None:
    """The question in a scorer's ``inputs`` or a root span's inputs, whatever shape the app logged (module
    docstring); None when it cannot be told."""
    value = _plain(inputs)
    if value is None or _depth > _DEPTH:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        if _is_messages(value):
            return last_user_turn(value)
        if len(value) == 1:  # LangChain's batch of one conversation ([[messages]]), a list of one question
            return question_of(value[0], _depth + 1)
        return None
    if not isinstance(value, dict):
        return None
    for key in ("messages", "input", "chat_history"):  # a conversation: its last user turn
        if _is_messages(value.get(key)):
            turn = last_user_turn(value[key])
            if turn is not None:
                return turn
    for key in QUESTION_KEYS:
        if isinstance(value.get(key), str):
            return value[key]
    for key in QUESTION_KEYS:  # one level down: {"request": {"input": [...]}}, {"str_or_query_bundle": {...}}
        if key in value and not isinstance(value[key], str):
            found = question_of(value[key], _depth + 1)
            if found is not None:
                return found
    texts = [v for v in value.values() if isinstance(v, str)]
    if len(texts) == 1:  # a function's one text argument, whatever its name: {"q": ..., "k": 3}
        return texts[0]
    if len(value) == 1:
        return question_of(next(iter(value.values())), _depth + 1)
    return None


def _mlflow_output_text(value: Any) -> str | None:
    """MLflow's own reading of an output (chat choices, chat messages, the Responses API); None where it knows no
    shape (it then gives the value's JSON, which is not an answer)."""
    try:
        text = parse_outputs_to_str(value)
    except Exception:  # a shape it does not expect
        return None
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        if json.loads(text) == json.loads(json.dumps(value, default=str)):
            return None  # its fallback: the value written as JSON
    except ValueError:
        pass
    return text


def answer_of(outputs: Any, _depth: int = 0) -> str | None:
    """The answer in a scorer's ``outputs`` or a root span's outputs, whatever shape the app logged (module
    docstring); None when it cannot be told."""
    value = _plain(outputs)
    if value is None or _depth > _DEPTH:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        if _is_messages(value):
            return _last_assistant_turn(value)
        if len(value) == 1:  # a pyfunc model's list of one prediction, a batch of one generation
            return answer_of(value[0], _depth + 1)
        return None
    if not isinstance(value, dict):
        return None
    # the chat shapes, as MLflow reads them: choices[0].message, messages[-1], the Responses API's output
    choices = value.get("choices")
    if isinstance(choices, list) and choices and isinstance(_plain(choices[0]), dict):
        first = _plain(choices[0])
        message = _plain(first.get("message"))
        if isinstance(message, dict) and _text_of_content(message.get("content")):
            return _text_of_content(message.get("content"))
        if isinstance(first.get("text"), str):  # the completions API
            return str(first["text"])
    mlflow_text = _mlflow_output_text(value)
    if mlflow_text is not None:
        return mlflow_text
    if isinstance(value.get("content"), list) and _role(value) in (*_ASSISTANT, None):
        text = _text_of_content(value["content"])  # an Anthropic message: its text blocks
        if text:
            return text
    message = _plain(value.get("message"))  # LlamaIndex's ChatResponse: {"message": {"role", "blocks"}}
    if isinstance(message, dict) and _role(message) in _ASSISTANT:
        text = _message_text(message)
        if text:
            return text
    if _is_messages(value.get("messages")):  # an agent's state: the last assistant turn
        text = _last_assistant_turn(value["messages"])
        if text:
            return text
    generations = value.get("generations")  # LangChain's ChatResult / LLMResult
    if isinstance(generations, list) and generations:
        first = generations[0][0] if isinstance(generations[0], list) and generations[0] else generations[0]
        first = _plain(first)
        if isinstance(first, dict):
            if isinstance(first.get("text"), str) and first["text"]:
                return str(first["text"])
            message = _plain(first.get("message"))
            if isinstance(message, dict):
                text = _text_of_content(message.get("content"))
                if text:
                    return text
    for key in ANSWER_KEYS:
        if isinstance(value.get(key), str):
            return value[key]
    for key in ANSWER_KEYS:  # one level down: {"output": {"answer": ...}}, {"response": ChatCompletion}
        if key in value and not isinstance(value[key], str):
            found = answer_of(value[key], _depth + 1)
            if found is not None:
                return found
    texts = [v for v in value.values() if isinstance(v, str)]
    if len(texts) == 1:
        return texts[0]
    return None


# --------------------------------------------------------------------------- the trace


def root_span(trace: Any) -> Any:
    """The trace's root span (the one with no parent), or None."""
    spans = list(getattr(getattr(trace, "data", None), "spans", None) or [])
    for span in spans:
        if getattr(span, "parent_id", None) is None:
            return span
    return None


@dataclass
class TraceDocument:
    """One retrieved document: its text and its id (None when the retriever gave none)."""

    text: str
    id: str | None = None


@dataclass
class Retrieved:
    """The documents of a trace's RETRIEVER spans and which spans they came from (``"name (n documents)"``)."""

    documents: list[TraceDocument] = field(default_factory=list)
    spans: list[str] = field(default_factory=list)
    #: the names of every top-level RETRIEVER span of the trace, read or not
    available: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return ", ".join(self.spans)


def _document(chunk: Any) -> TraceDocument | None:
    chunk = _plain(chunk)
    if isinstance(chunk, str):
        return TraceDocument(chunk)
    if not isinstance(chunk, dict):
        return None
    node = _plain(chunk.get("node"))  # a LlamaIndex NodeWithScore logged as it is
    if isinstance(node, dict) and not any(isinstance(chunk.get(k), str) for k in _CONTENT_KEYS):
        chunk = {**node, "metadata": node.get("metadata") or chunk.get("metadata")}
    text = next((chunk[k] for k in _CONTENT_KEYS if isinstance(chunk.get(k), str)), None)
    if text is None:
        return None
    meta = chunk.get("metadata") if isinstance(chunk.get("metadata"), dict) else {}
    doc_id = meta.get("doc_uri") or chunk.get("id") or chunk.get("id_")
    for key in _ID_KEYS:
        if doc_id:
            break
        doc_id = meta.get(key)
    return TraceDocument(text, str(doc_id) if doc_id not in (None, "") else None)


def _chunks(outputs: Any) -> list[Any]:
    outputs = _plain(outputs)
    if isinstance(outputs, str):
        try:
            outputs = json.loads(outputs)
        except ValueError:
            return [outputs]
    if isinstance(outputs, dict):  # {"documents": [...]}, {"nodes": [...]}, {"source_nodes": [...]}
        for key in ("documents", "docs", "nodes", "source_nodes", "results", "chunks"):
            if isinstance(outputs.get(key), list):
                return list(outputs[key])
        return [outputs]
    return list(outputs) if isinstance(outputs, (list, tuple)) else []


def _top_level_retrievers(trace: Any) -> list[Any]:
    """RETRIEVER spans that are not inside another RETRIEVER span, in the order they started."""
    spans = list(getattr(getattr(trace, "data", None), "spans", None) or [])
    by_id = {s.span_id: s for s in spans}

    def is_retriever(span: Any) -> bool:
        return str(getattr(span, "span_type", "") or "").upper() == "RETRIEVER"

    found = []
    for span in spans:
        if not is_retriever(span):
            continue
        parent = by_id.get(span.parent_id) if span.parent_id else None
        seen = 0
        while parent is not None and not is_retriever(parent) and seen < len(spans):
            parent = by_id.get(parent.parent_id) if parent.parent_id else None
            seen += 1
        if parent is None:
            found.append(span)
    return sorted(found, key=lambda s: getattr(s, "start_time_ns", 0) or 0)


def retrieved(trace: Any, which: str | Sequence[str] = "all") -> Retrieved:
    """The documents of ``trace``'s RETRIEVER spans (module docstring): ``which`` is ``"all"`` (every top-level
    retriever, documents de-duplicated), ``"first"``, ``"last"``, or span names."""
    out = Retrieved()
    if trace is None:
        return out
    spans = _top_level_retrievers(trace)
    out.available = [s.name for s in spans]
    if which == "last":
        spans = spans[-1:]
    elif which == "first":
        spans = spans[:1]
    elif which != "all":
        names = {which} if isinstance(which, str) else set(which)
        spans = [s for s in spans if s.name in names]
    seen: set[tuple[str | None, str]] = set()
    for span in spans:
        docs = [d for d in (_document(c) for c in _chunks(span.outputs)) if d is not None]
        out.spans.append(f"{span.name} ({len(docs)} document{'s' if len(docs) != 1 else ''})")
        for d in docs:
            key = (d.id, d.text)
            if key not in seen:
                seen.add(key)
                out.documents.append(d)
    return out


# --------------------------------------------------------------------------- what was looked for, for error messages


def describe(value: Any) -> str:
    """A short description of a value's shape, for an error message."""
    value = _plain(value)
    if value is None:
        return "nothing"
    if isinstance(value, str):
        return "an empty string" if not value.strip() else "a string"
    if isinstance(value, dict):
        keys = list(value)[:12]
        return f"a dict with keys {keys}" + (" ..." if len(value) > 12 else "")
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} item{'s' if len(value) != 1 else ''}"
    return f"a {type(value).__name__}"


def where_question(inputs: Any) -> str:
    return (f"no question in the inputs ({describe(inputs)}): looked for the text of "
            f"{', '.join(repr(k) for k in QUESTION_KEYS[:6])} ..., the last user turn of 'messages' (chat APIs) or "
            "'input' (the Responses API), a lone text argument, and the trace's root span inputs. Give it by name: "
            "data=[{'inputs': {'question': ...}, 'outputs': ..., 'expectations': {...}}], or evaluate with "
            "predict_fn=your_app whose argument is named 'question'")


def where_answer(outputs: Any) -> str:
    return (f"no answer in the outputs ({describe(outputs)}): looked for a string, a chat completion's first choice, "
            "an Anthropic message's text, the last assistant turn of 'messages', the Responses API's output text, "
            f"LangChain generations and the keys {', '.join(repr(k) for k in ANSWER_KEYS[:6])} ..., and the trace's "
            "root span outputs. Give it as text: data=[{'inputs': {...}, 'outputs': 'the answer', ...}] or "
            "{'outputs': {'answer': ...}}")
