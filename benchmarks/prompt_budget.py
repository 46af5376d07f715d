"""What our judge requests spend their prompt tokens on, per metric: fixed instructions, fencing, the row's data.

Run from the repository root::

    .venv/bin/python benchmarks/prompt_budget.py                      # the 40 rows of bench_vs_peers.py, k = 5
    .venv/bin/python benchmarks/prompt_budget.py --rev HEAD~3         # the package as committed at a revision

The six judged metrics (correctness, faithfulness, answer relevancy, context precision, recall and relevance) run
through ``evaluate_frame`` on ``bench_vs_peers.make_rows(40, 5)`` against the fake OpenAI server
(``tests/fakellm.py``) answered by ``tests/compliant_model.py``'s independent ``CompliantModel``. Every chat
request the server received is split, word by word (whitespace-separated words of its messages: what the fake
server reports as ``usage.prompt_tokens``; about 1.3 BPE tokens per English word), into

* **data**: the words inside a fence (the question, answer, reference, passages, claims ... of the row);
* **fences**: the fence tags themselves (``<data-… name="…">``, ``</data-…>``, ``<passage-… n="k">`` ...) and
  the system message's note about them;
* **fixed**: everything else, the instructions we wrote (role line, rules, scale, the reply's format),

and attributed to the prompt it was rendered from (its system message's first sentence). Characters are counted
the same way. The report is per prompt, then per row for the whole run; ``--json`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]

from _at_rev import in_child, rerun_at  # noqa: E402

_OPEN = re.compile(r'<((?:data|passage|sentence)-[0-9a-f]+)(?: name="[^"]*"| n="\d+")>')
METRICS = ("correctness", "faithfulness", "answer_relevancy", "context_precision", "context_recall",
           "context_relevance")


def split_message(text: str) -> tuple[str, str, str]:
    """(data, fences, fixed) text of one message: fenced content, the tags, the rest."""
    data: list[str] = []
    fences: list[str] = []
    fixed: list[str] = []
    pos = 0
    for m in _OPEN.finditer(text):
        if m.start() < pos:
            continue  # an item fence inside a data fence: counted with its data fence
        close = f"</{m.group(1)}>"
        end = text.find(close, m.end())
        if end < 0:
            continue
        fixed.append(text[pos:m.start()])
        inner = text[m.end():end]
        fences.append(m.group(0) + " " + close)
        inner_fixed = []
        ipos = 0
        for im in _OPEN.finditer(inner):  # item fences inside: tags are fences, their text data
            iclose = f"</{im.group(1)}>"
            iend = inner.find(iclose, im.end())
            if iend < 0 or im.start() < ipos:
                continue
            inner_fixed.append(inner[ipos:im.start()])
            fences.append(im.group(0) + " " + iclose)
            data.append(inner[im.end():iend])
            ipos = iend + len(iclose)
        data.append("".join(inner_fixed) + inner[ipos:])
        pos = end + len(close)
    fixed.append(text[pos:])
    return " ".join(data), " ".join(fences), " ".join(fixed)


def measure(rows: int, k: int) -> dict[str, Any]:
    import pandas as pd
    from bench_vs_peers import make_rows
    from compliant_model import CompliantModel
    from fakellm import FakeLLMServer

    from mlflow_ragjudge import evaluate_frame
    from mlflow_ragjudge.llm.prompts import FENCE_NOTES

    note_head = FENCE_NOTES["en"].split("<")[0]
    data_rows = make_rows(rows, k)
    df = pd.DataFrame([{c: r[c] for c in ("question", "answer", "reference", "contexts")} for r in data_rows])
    with FakeLLMServer() as server:
        server.set_handler(CompliantModel(example_json=True, prompt_schema_too=True))
        url = server.openai_base_url
        out = evaluate_frame(df, judge=f"openai:/judge-model?base_url={url}", embeddings=f"openai:/emb?base_url={url}",
                             metrics=list(METRICS), cache=False)
        chat = [r for r in server.requests if r.api == "openai_chat"]
    prompts: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in chat:
        body = json.loads(r.raw_body)
        system = next((m["content"] for m in body["messages"] if m["role"] == "system"), "")
        role = system.split("\n")[0].split(".")[0] or "(no system message)"
        fig = prompts[role]
        fig["requests"] += 1
        for m in body["messages"]:
            text = m["content"] if isinstance(m["content"], str) else json.dumps(m["content"])
            if m["role"] == "system" and note_head in text:  # the note about the fences is fencing
                head, _, note = text.partition(note_head)
                fences_note = note_head + note
                text = head
            else:
                fences_note = ""
            data, fences, fixed = split_message(text)
            fences = (fences + " " + fences_note).strip()
            for part, value in (("data", data), ("fences", fences), ("fixed", fixed)):
                fig[f"{part}_words"] += len(value.split())
                fig[f"{part}_chars"] += len(value)
    lost = sum(1 for m in METRICS for res in out.results[m] if res.status.value not in ("scored", "abstained"))
    return {"rows": rows, "k": k, "chat_requests": len(chat), "results_not_scored": lost,
            "prompts": {p: dict(v) for p, v in prompts.items()}}


def report(fig: dict[str, Any]) -> str:
    n = fig["rows"]
    lines = [f"{n} rows, k = {fig['k']}: {fig['chat_requests']} chat requests "
             f"({fig['chat_requests'] / n:.2f} per row)", "",
             "| prompt (system message's first words) | requests/row | fixed words/req | fences words/req | "
             "data words/req | words/row | chars/row |", "|---|---:|---:|---:|---:|---:|---:|"]
    tot: dict[str, float] = defaultdict(float)
    for name, p in sorted(fig["prompts"].items(), key=lambda kv: -kv[1]["requests"]):
        q = p["requests"]
        words = p["fixed_words"] + p["fences_words"] + p["data_words"]
        chars = p["fixed_chars"] + p["fences_chars"] + p["data_chars"]
        for key in ("fixed_words", "fences_words", "data_words", "fixed_chars", "fences_chars", "data_chars"):
            tot[key] += p[key]
        lines.append(f"| {name[:60]} | {q / n:.2f} | {p['fixed_words'] / q:.0f} | {p['fences_words'] / q:.0f} | "
                     f"{p['data_words'] / q:.0f} | {words / n:.0f} | {chars / n:.0f} |")
    words = tot["fixed_words"] + tot["fences_words"] + tot["data_words"]
    chars = tot["fixed_chars"] + tot["fences_chars"] + tot["data_chars"]
    lines += ["", f"Per row: {words / n:.0f} words = fixed {tot['fixed_words'] / n:.0f} + fences "
              f"{tot['fences_words'] / n:.0f} + data {tot['data_words'] / n:.0f}; {chars / n:.0f} characters = fixed "
              f"{tot['fixed_chars'] / n:.0f} + fences {tot['fences_chars'] / n:.0f} + data "
              f"{tot['data_chars'] / n:.0f}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=40)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--rev", help="measure the package as committed at this git revision (git archive)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.rev and not in_child():
        return rerun_at(args.rev, __file__, argv)
    fig = measure(args.rows, args.k)
    import mlflow_ragjudge

    fig["package"] = mlflow_ragjudge.__file__
    print(report(fig))
    if args.json:
        args.json.write_text(json.dumps(fig, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
