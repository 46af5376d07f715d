"""Record MLflow-autologged traces of small RAG apps as JSON fixtures (this folder; see README.md).

Every app runs against tests/fakellm.py (no real LLM, no network): a retriever returns 3 documents with ids,
one generator call answers, and the trace MLflow's autologging recorded is saved as ``<library>_<shape>.json``
(``Trace.to_json(pretty=True)``) and read back with ``Trace.from_json``. Any attempt to reach a host other than
this machine is reported (an audit hook on ``socket.connect`` / ``socket.getaddrinfo``) and fails the run.

Two scratch venvs, since llama-index-llms-openai needs openai<3 and the project's venv has openai 3::

    python3 -m venv /tmp/rec-lc && /tmp/rec-lc/bin/pip install mlflow==3.17.2 openai==3.57.0 \
        anthropic==2.14.0 langchain-core==1.8.3 langchain-openai==1.7.4
    python3 -m venv /tmp/rec-li && /tmp/rec-li/bin/pip install mlflow==3.17.2 llama-index-core==0.14.25 \
        llama-index-llms-openai==0.8.3 openai==2.54.0

    cd <repo> && PYTHONPATH=tests /tmp/rec-lc/bin/python tests/data/traces/record.py langchain openai anthropic sessions
    cd <repo> && PYTHONPATH=tests /tmp/rec-li/bin/python tests/data/traces/record.py llama_index

(To prove it offline as well: ``unshare -n sh -c 'ip link set lo up; PYTHONPATH=tests ... record.py ...'``.)
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

_DB_DIR = tempfile.mkdtemp(prefix="ragjudge-record-")
os.environ.update({
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "MLFLOW_MODEL_CATALOG_URI": "",
    "MLFLOW_TRACKING_URI": f"sqlite:///{_DB_DIR}/mlflow.db",
})

OUT = Path(__file__).resolve().parent

# ------------------------------------------------------------------------------------------ network guard

_LOCAL = {"127.0.0.1", "::1", "localhost", None}
NETWORK_ATTEMPTS: list[tuple[str, Any]] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.connect":
        address = args[1]
        if isinstance(address, tuple) and address[0] not in _LOCAL:
            NETWORK_ATTEMPTS.append((event, address))
    elif event == "socket.getaddrinfo" and args[0] not in _LOCAL:
        NETWORK_ATTEMPTS.append((event, args[0]))


sys.addaudithook(_audit)

import mlflow  # noqa: E402 - after the environment above
from fakellm import FakeLLMServer, Request  # noqa: E402
from mlflow.entities import Trace  # noqa: E402

# ------------------------------------------------------------------------------------------ the content

QUESTION = "When was the Eiffel Tower completed?"
FIRST_QUESTION = "Who built the Eiffel Tower?"
FOLLOW_UP = "When was it completed?"
ANSWER = "The Eiffel Tower was completed in 1889."
FIRST_ANSWER = "Gustave Eiffel's engineering company built it."
SYSTEM = "Answer the question from the context only."
DOCS = [  # (id, text, source)
    ("doc-1", "The Eiffel Tower was completed in 1889 for the Exposition Universelle.", "eiffel.txt"),
    ("doc-2", "The tower is 330 metres tall and stands on the Champ de Mars in Paris.", "paris.txt"),
    ("doc-3", "Gustave Eiffel's engineering company designed and built the tower.", "eiffel.txt"),
]


def fake_answer(request: Request) -> str:
    """The fake LLM's reply: a standalone question for a condense prompt, else the answer to the question."""
    prompt = request.prompt_text.lower()
    if "standalone question" in prompt:
        return QUESTION
    last = request.last_user_text.lower()
    if "when was" in last:
        return ANSWER
    if "who built" in last:
        return FIRST_ANSWER
    return ANSWER


def context_text() -> str:
    return "\n\n".join(f"[{doc_id}] {text}" for doc_id, text, _ in DOCS)


# ------------------------------------------------------------------------------------------ saving


def save(name: str, trace_id: str | None = None) -> None:
    """Save the last (or the given) trace as ``<name>.json`` and check that it loads back."""
    mlflow.flush_trace_async_logging()
    trace_id = trace_id or mlflow.get_last_active_trace_id()
    trace = mlflow.get_trace(trace_id)
    if trace is None:
        raise RuntimeError(f"{name}: trace {trace_id} was not found")
    text = trace.to_json(pretty=True) + "\n"
    loaded = Trace.from_json(text)
    assert [s.name for s in loaded.data.spans] == [s.name for s in trace.data.spans]
    (OUT / f"{name}.json").write_text(text)
    spans = ", ".join(f"{s.name}:{s.span_type}" for s in trace.data.spans)
    print(f"{name}.json  {len(text):>6} chars  {len(trace.data.spans)} spans  [{spans}]")


# ------------------------------------------------------------------------------------------ LangChain


def record_langchain(server: FakeLLMServer) -> None:
    from operator import itemgetter

    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables import RunnablePassthrough
    from langchain_openai import ChatOpenAI

    mlflow.langchain.autolog()

    class EiffelRetriever(BaseRetriever):
        """Returns every document of the tiny corpus (3), with ids in ``Document.id`` and the metadata."""

        def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun
                                    ) -> list[Document]:
            return [Document(page_content=text, metadata={"id": doc_id, "source": source}, id=doc_id)
                    for doc_id, text, source in DOCS]

    def format_docs(docs: list[Document]) -> str:
        return "\n\n".join(f"[{d.id}] {d.page_content}" for d in docs)

    retriever = EiffelRetriever()
    prompt = ChatPromptTemplate.from_messages([("system", SYSTEM + "\n\nContext:\n{context}"), ("human", "{question}")])
    llm = ChatOpenAI(model="gpt-4o-mini", base_url=server.openai_base_url, api_key="x", max_retries=0)

    chain = {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()
    assert chain.invoke(QUESTION) == ANSWER
    save("langchain_lcel_str")

    # A dict input cannot flow through the chain above (the retriever wants a string): the usual dict shape
    # picks the question out with itemgetter on both branches.
    dict_chain = ({"context": itemgetter("question") | retriever | format_docs, "question": itemgetter("question")}
                  | prompt | llm | StrOutputParser())
    assert dict_chain.invoke({"question": QUESTION}) == ANSWER
    save("langchain_lcel_dict")

    message = llm.invoke([SystemMessage(SYSTEM + "\n\nContext:\n" + context_text()), HumanMessage(QUESTION)])
    assert message.content == ANSWER
    save("langchain_chat_model")
    mlflow.langchain.autolog(disable=True)


# ------------------------------------------------------------------------------------------ LlamaIndex


def record_llama_index(server: FakeLLMServer) -> None:
    from llama_index.core import MockEmbedding, Settings, VectorStoreIndex
    from llama_index.core.schema import TextNode
    from llama_index.llms.openai import OpenAI

    mlflow.llama_index.autolog()
    # MockEmbedding: a constant vector, no model to download (all documents score alike, all 3 come back).
    Settings.embed_model = MockEmbedding(embed_dim=8)
    Settings.llm = OpenAI(model="gpt-4o-mini", api_base=server.openai_base_url, api_key="x", max_retries=0)
    nodes = [TextNode(text=text, id_=doc_id, metadata={"source": source}) for doc_id, text, source in DOCS]
    index = VectorStoreIndex(nodes)

    query_engine = index.as_query_engine(similarity_top_k=3)  # a RetrieverQueryEngine
    assert str(query_engine.query(QUESTION)) == ANSWER
    save("llama_index_query_engine")

    # condense_plus_context: turn 2 condenses the history + follow-up into a standalone question (one LLM
    # call), retrieves with it, then answers (a second call). The second turn is the trace saved.
    chat_engine = index.as_chat_engine(chat_mode="condense_plus_context", similarity_top_k=3)
    assert str(chat_engine.chat(FIRST_QUESTION)) == FIRST_ANSWER
    assert str(chat_engine.chat(FOLLOW_UP)) == ANSWER
    save("llama_index_chat_engine")
    mlflow.llama_index.autolog(disable=True)


# ------------------------------------------------------------------------------------------ OpenAI


def _retriever() -> Callable[[str], list[Any]]:
    from mlflow.entities import Document, SpanType

    @mlflow.trace(span_type=SpanType.RETRIEVER)
    def retrieve(query: str) -> list[Document]:
        return [Document(page_content=text, metadata={"doc_uri": source, "chunk_id": doc_id}, id=doc_id)
                for doc_id, text, source in DOCS]

    return retrieve


def _history(question: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": FIRST_QUESTION}, {"role": "assistant", "content": FIRST_ANSWER},
            {"role": "user", "content": question}]


def record_openai(server: FakeLLMServer) -> None:
    import openai

    mlflow.openai.autolog()
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="x", max_retries=0)
    retrieve = _retriever()

    @mlflow.trace
    def rag_app(messages: list[dict[str, Any]]) -> Any:
        docs = retrieve(messages[-1]["content"])
        context = "\n\n".join(f"[{d.id}] {d.page_content}" for d in docs)
        system = {"role": "system", "content": f"{SYSTEM}\n\nContext:\n{context}"}
        return client.chat.completions.create(model="gpt-4o-mini", messages=[system, *messages])

    completion = rag_app(_history(FOLLOW_UP))
    assert completion.choices[0].message.content == ANSWER
    save("openai_chat_app")

    response = client.responses.create(model="gpt-4o-mini", instructions=f"{SYSTEM}\n\nContext:\n{context_text()}",
                                       input=QUESTION)
    assert response.output_text == ANSWER
    save("openai_responses")

    completion = client.chat.completions.create(model="gpt-4o-mini", messages=[
        {"role": "system", "content": [{"type": "text", "text": f"{SYSTEM}\n\nContext:\n{context_text()}"}]},
        {"role": "user", "content": [{"type": "text", "text": QUESTION}]},
    ])
    assert completion.choices[0].message.content == ANSWER
    save("openai_chat_content_parts")
    mlflow.openai.autolog(disable=True)


# ------------------------------------------------------------------------------------------ Anthropic


def record_anthropic(server: FakeLLMServer) -> None:
    import anthropic

    mlflow.anthropic.autolog()
    client = anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="x", max_retries=0)
    retrieve = _retriever()

    message = client.messages.create(model="claude-sonnet-4-5", max_tokens=256,
                                     system=f"{SYSTEM}\n\nContext:\n{context_text()}",
                                     messages=[{"role": "user", "content": QUESTION}])
    assert message.content[0].text == ANSWER
    save("anthropic_messages")

    @mlflow.trace
    def rag_app(question: str) -> str:
        docs = retrieve(question)
        context = "\n\n".join(f"[{d.id}] {d.page_content}" for d in docs)
        reply = client.messages.create(model="claude-sonnet-4-5", max_tokens=256,
                                       system=f"{SYSTEM}\n\nContext:\n{context}",
                                       messages=[{"role": "user", "content": question}])
        return reply.content[0].text

    assert rag_app(QUESTION) == ANSWER
    save("anthropic_app")
    mlflow.anthropic.autolog(disable=True)


# ------------------------------------------------------------------------------------------ sessions


def record_sessions(server: FakeLLMServer) -> None:
    """Two turns of one conversation, each a trace of the OpenAI RAG app tagged with session "s1"."""
    import openai

    mlflow.openai.autolog()
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="x", max_retries=0)
    retrieve = _retriever()

    @mlflow.trace
    def chat_turn(messages: list[dict[str, Any]]) -> str:
        # the metadata key MLflow groups sessions by (update_current_trace(session_id="s1") writes the same)
        mlflow.update_current_trace(metadata={"mlflow.trace.session": "s1", "mlflow.trace.user": "u1"})
        docs = retrieve(messages[-1]["content"])
        context = "\n\n".join(f"[{d.id}] {d.page_content}" for d in docs)
        system = {"role": "system", "content": f"{SYSTEM}\n\nContext:\n{context}"}
        reply = client.chat.completions.create(model="gpt-4o-mini", messages=[system, *messages])
        return reply.choices[0].message.content

    history: list[dict[str, Any]] = [{"role": "user", "content": FIRST_QUESTION}]
    answer = chat_turn(history)
    assert answer == FIRST_ANSWER
    save("openai_session_turn1")
    history += [{"role": "assistant", "content": answer}, {"role": "user", "content": FOLLOW_UP}]
    assert chat_turn(history) == ANSWER
    save("openai_session_turn2")
    mlflow.openai.autolog(disable=True)


GROUPS: dict[str, Callable[[FakeLLMServer], None]] = {
    "langchain": record_langchain,
    "llama_index": record_llama_index,
    "openai": record_openai,
    "anthropic": record_anthropic,
    "sessions": record_sessions,
}


def main(argv: list[str]) -> int:
    names = argv or list(GROUPS)
    unknown = [n for n in names if n not in GROUPS]
    if unknown:
        print(f"unknown group(s) {unknown}; choose from {list(GROUPS)}", file=sys.stderr)
        return 2
    print(f"mlflow {mlflow.__version__}; traces in {OUT}")
    # artifacts in the scratch folder too (the default, ./mlruns, would land in the work tree)
    mlflow.set_experiment(experiment_id=mlflow.create_experiment(
        "record-traces", artifact_location=Path(_DB_DIR, "artifacts").as_uri()))
    with FakeLLMServer() as server:
        server.set_handler(fake_answer)
        for name in names:
            GROUPS[name](server)
    if NETWORK_ATTEMPTS:
        print(f"network attempts beyond this machine: {NETWORK_ATTEMPTS}", file=sys.stderr)
        return 1
    print("no connection beyond this machine was attempted")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
