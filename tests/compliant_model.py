"""An independent, compliant judge model for the fake server. It knows nothing of mlflow-ragjudge's prompts.

It answers the way a capable model behind a real OpenAI-compatible server does, reading only what any
model could read generically -- never the package's prompt wording:

* the JSON schema the client sent (OpenAI ``response_format`` ``json_schema``, Anthropic tool
  ``input_schema``) or, when none was sent, a JSON schema written into the conversation (any JSON object
  in a message with ``"type": "object"`` and ``"properties"``; the most recent one counts);
* with ``prompt_schema_too=True``, when the request carries a schema and the conversation also shows one
  with the same top-level fields, it fills the conversation's (which may fix counts the other leaves open);
* it fills every field the schema declares: an array gets ``minItems`` items, two when the schema sets no
  count (capped at ``maxItems``); in the i-th item of an array, an integer field whose schema enumerates
  its values takes the i-th value -- how a model numbers its entries down a numbered list; other enum
  fields, booleans and unbounded integers get values chosen by a hash of the conversation; strings are
  short sentences, different for every request and field;
* with no schema anywhere it answers in prose (it has no idea what format a grader wants) -- unless it was
  built with ``example_json=True``: then, when the conversation shows an example JSON object (the most
  recent one), it answers with an object of the same shape: the same keys, short label-like strings and
  numbers as in the example (the way a model copies an answer format), longer strings replaced by its own
  sentences, arrays as long as the example's;
* a label written as alternatives (``"yes|no"``, ``"pass | fail"``) in an example JSON object is an instruction
  to pick one: the model picks one by the hash of the conversation -- in an example it copies, and, with
  ``prompt_schema_too=True``, in a free string field of the request's schema when the conversation shows an
  example object with the same top-level fields (a schema that says only "string" while the prompt shows the
  allowed values, as MLflow's built-in judges send).

Server modes, like the servers users run:

* ``json_schema`` -- honours ``response_format`` ``json_schema`` and ``json_object`` (OpenAI, vLLM, Ollama);
* ``json_object`` -- refuses ``json_schema`` with HTTP 400 naming ``response_format``, honours JSON mode;
* ``text`` -- refuses any ``response_format`` with HTTP 400 and answers in plain text: JSON written bare,
  inside a ```json fence after a lead-in sentence, or followed by a remark;
* ``text_422`` -- like ``text``, but refuses the way TGI does: HTTP 422, a deserialisation message, no
  ``param``;
* ``ignores_format`` -- accepts any ``response_format`` and ignores it: it reads a schema only from the
  conversation, like a proxy that drops the parameter on the floor.

Usage::

    fake_llm.set_handler(CompliantModel("json_object"))
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from fakellm import Reply, Request

MODES = ("json_schema", "json_object", "text", "text_422", "ignores_format")


def _h(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(parts).encode("utf-8", "surrogatepass")).digest()[:8], "big")


_WORDS = ("the", "passage", "states", "this", "point", "clearly", "answer", "covers", "detail", "evidence",
          "question", "matches", "part", "fact", "given", "named")


def _sentence(seed: str, path: str) -> str:
    n = _h(seed, path)
    words = [_WORDS[(n >> (4 * i)) % len(_WORDS)] for i in range(6)]
    return f"{words[0].capitalize()} {' '.join(words[1:])} (note {n % 100000:05d})."


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """Follow local ``$ref`` pointers (``#/$defs/Name``, ``#/definitions/Name``) and merge ``allOf``,
    as pydantic writes them; pick the first non-null branch of ``anyOf``/``oneOf`` (an optional field)."""
    for _ in range(32):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            target: Any = root
            for part in ref[2:].split("/"):
                target = target.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(target, dict) else {}
            schema = {**{k: v for k, v in schema.items() if k != "$ref"}, **(target or {})}
            continue
        if isinstance(schema.get("allOf"), list):
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                if isinstance(part, dict):
                    merged = {**merged, **_resolve(part, root)}
            schema = merged
            continue
        branches = schema.get("anyOf") or schema.get("oneOf")
        if isinstance(branches, list) and branches and "type" not in schema:
            pick = next((b for b in branches if isinstance(b, dict) and b.get("type") != "null"), branches[0])
            schema = {**{k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}, **pick}
            continue
        return schema
    return schema


def fill(schema: dict[str, Any], seed: str, path: str = "$", index: int | None = None,
         root: dict[str, Any] | None = None) -> Any:
    """A value that validates against ``schema`` (the subset real judges' schemas use, with local ``$ref``s,
    ``allOf`` and optional ``anyOf`` fields as pydantic writes them)."""
    root = schema if root is None else root
    if any(k in schema for k in ("$ref", "allOf", "anyOf", "oneOf")):
        schema = _resolve(schema, root)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        values = list(schema["enum"])
        if index is not None and values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return values[index % len(values)]
        return values[_h(seed, path) % len(values)]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        return {k: fill(sub, seed, f"{path}.{k}", index, root) for k, sub in schema.get("properties", {}).items()}
    if kind == "array":
        n = int(schema.get("minItems") or 0) or 2
        if "maxItems" in schema:
            n = min(n, int(schema["maxItems"]))
        return [fill(schema.get("items", {}), seed, f"{path}[{i}]", i, root) for i in range(n)]
    if kind in ("integer", "number"):
        lo, hi = schema.get("minimum"), schema.get("maximum")
        if lo is not None:
            v = lo + (index or 0)
            return min(v, hi) if hi is not None else v
        if hi is not None:
            return hi
        return index or 0
    if kind == "boolean":
        return bool(_h(seed, path) & 1)
    if kind == "null":
        return None
    return _sentence(seed, path)


_ELLIPSIS_ITEM = re.compile(r",\s*(?:\.\.\.|\u2026)\s*(?=[\]}])")  # [a, b, ...] -> [a, b]
_ELLIPSIS_ONLY = re.compile(r"\[\s*(?:\.\.\.|\u2026)\s*\]")  # [...] -> []
_TRAILING_COMMA = re.compile(r",\s*(?=[\]}])")
_PLACEHOLDER_VALUE = re.compile(r"(:\s*)<([^<>\"\n]*)>")  # "reason": <your reason> -> "reason": "<your reason>"


def _lenient(chunk: str) -> str:
    chunk = _PLACEHOLDER_VALUE.sub(lambda m: f'{m.group(1)}"<{m.group(2)}>"', chunk)
    return _TRAILING_COMMA.sub("", _ELLIPSIS_ONLY.sub("[]", _ELLIPSIS_ITEM.sub("", chunk)))


def _brace_end(text: str, start: int) -> int:
    """The index of the ``}`` closing the ``{`` at ``start`` (string-aware), or -1."""
    depth, in_str, esc = 0, False, False
    for j in range(start, len(text)):
        c = text[j]
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return j
    return -1


def _json_objects(text: str, *, lenient: bool = False) -> list[dict[str, Any]]:
    """Top-level JSON objects written in a text (string-aware brace matching). ``lenient`` reads them the way
    a model reads an example: an ``...`` item ("and so on") and trailing commas are dropped, and a bare
    ``<placeholder>`` value is read as a string, before parsing.

    Deliberately not the package's own ``parsing.iter_json_objects``: a fake that reads prompts with our
    parser would only prove that we agree with ourselves."""
    out: list[dict[str, Any]] = []
    i = 0
    while True:
        start = text.find("{", i)
        if start == -1:
            return out
        end = _brace_end(text, start)
        if end == -1:
            return out
        chunk = text[start: end + 1]
        obj = None
        for candidate in (chunk, _lenient(chunk)) if lenient else (chunk,):
            try:
                obj = json.loads(candidate)
                break
            except ValueError:
                continue
        if isinstance(obj, dict):
            out.append(obj)
            i = end + 1
        else:
            i = start + 1


def example_in_conversation(request: Request) -> dict[str, Any] | None:
    """The most recent example JSON object written into the messages (not a schema), if any."""
    found = None
    for message in request.messages:
        for obj in _json_objects(message["content"], lenient=True):
            if not (obj.get("type") == "object" and isinstance(obj.get("properties"), dict)):
                found = obj
    return found


_ALTERNATIVES = re.compile(r"^\s*[\w-]+(?:\s*\|\s*[\w-]+)+\s*$")  # "yes|no", "pass | fail"


def _pick(text: str, seed: str, path: str) -> str:
    options = [o.strip() for o in text.split("|")]
    return options[_h(seed, path) % len(options)]


def like_example(example: Any, seed: str, path: str = "$") -> Any:
    """A value shaped like ``example``: same keys and array lengths; short strings (labels such as
    ``"yes"``) and numbers kept as shown; longer strings and placeholders (``"<...>"``, ``"..."``) replaced
    by a sentence of this model's own."""
    if isinstance(example, dict):
        return {k: like_example(v, seed, f"{path}.{k}") for k, v in example.items()}
    if isinstance(example, list):
        return [like_example(v, seed, f"{path}[{i}]") for i, v in enumerate(example)]
    if isinstance(example, str):
        text = example.strip()
        if _ALTERNATIVES.match(text):
            return _pick(text, seed, path)
        placeholder = (text.startswith("<") and text.endswith(">")) or text in ("...", "\u2026", "")
        if placeholder or len(text.split()) > 3:
            return _sentence(seed, path)
    return example


def schema_in_conversation(request: Request) -> dict[str, Any] | None:
    """The most recent JSON schema written into the messages, if any."""
    found = None
    for message in request.messages:
        for obj in _json_objects(message["content"]):
            if obj.get("type") == "object" and isinstance(obj.get("properties"), dict):
                found = obj
    return found


class CompliantModel:
    """A fake-server handler: an independent model that follows schemas (see the module docstring)."""

    def __init__(self, mode: str = "json_schema", *, example_json: bool = False,
                 prompt_schema_too: bool = False) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.mode = mode
        self.example_json = example_json  # no schema anywhere: copy the shape of an example JSON object
        # an API schema and, in the prompt, a schema of the same fields: fill the prompt's (it may fix counts
        # the API one leaves open), as a model constrained by one and reading the other would answer
        self.prompt_schema_too = prompt_schema_too
        self.refused = 0  # requests refused for their response_format

    def _refuse(self, kind: str) -> Reply:
        self.refused += 1
        if self.mode == "text_422":
            return Reply.error(422, "Failed to deserialize the JSON body into the target type: response_format: "
                                    f"unknown variant `{kind}`, expected `json` or `regex` at line 1 column 80")
        if self.mode == "json_object":
            return Reply.error(400, f"Invalid value for 'response_format.type': '{kind}' is not supported by this "
                                    "server. Supported values are: 'text', 'json_object'.", param="response_format")
        return Reply.error(400, "This server does not support the 'response_format' parameter.",
                           param="response_format")

    def __call__(self, request: Request) -> Any:
        if request.api == "openai_embeddings":
            return None  # the server's default: a hashed bag-of-words vector
        seed = json.dumps(request.messages, sort_keys=True)
        fmt = request.response_format if request.api == "openai_chat" else None
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "json_schema" and self.mode in ("json_object", "text", "text_422"):
            return self._refuse(kind)
        if kind == "json_object" and self.mode in ("text", "text_422"):
            return self._refuse(kind)
        schema = request.json_schema  # response_format json_schema, or an Anthropic tool's input_schema
        if self.mode == "ignores_format" and request.api == "openai_chat":
            schema, kind = None, None
        if schema is not None:
            if self.prompt_schema_too:
                written = schema_in_conversation(request)
                if written is not None and set(written.get("properties", {})) == set(schema.get("properties", {})):
                    return fill(written, seed)
                shown = example_in_conversation(request)
                props = schema.get("properties", {})
                if shown is not None and set(shown) == set(props):
                    value = fill(schema, seed)
                    for key, sub in props.items():
                        label = shown[key]
                        if (isinstance(value, dict) and sub.get("type") == "string" and "enum" not in sub
                                and isinstance(label, str) and _ALTERNATIVES.match(label)):
                            value[key] = _pick(label, seed, f"$.{key}")
                    return value
            return fill(schema, seed)
        schema = schema_in_conversation(request)
        example = example_in_conversation(request) if schema is None and self.example_json else None
        if example is not None:
            return Reply(text=json.dumps(like_example(example, seed), ensure_ascii=False, indent=1))
        if schema is None:
            if kind == "json_object":
                return Reply(text=json.dumps({"answer": _sentence(seed, "answer")}))
            return Reply(text=_sentence(seed, "prose") + " " + _sentence(seed, "prose2"))
        value = json.dumps(fill(schema, seed), ensure_ascii=False, indent=1)
        if kind == "json_object":
            return Reply(text=value)
        style = _h(seed, "style") % 3
        if style == 0:
            return Reply(text=value)
        if style == 1:
            return Reply(text=f"Here is my evaluation:\n\n```json\n{value}\n```")
        return Reply(text=f"{value}\n\nI followed the requested format.")
