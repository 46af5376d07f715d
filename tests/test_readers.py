"""The CLI's readers (mlflow_ragjudge/cli/reading.py) read what the user wrote: text columns as text, whatever type
pandas or pyarrow would infer (a CSV answer 42, a row id 007, a JSON number, a Parquet int column), and a Parquet
dict-of-grades column as each row's own dict (not a struct with None for the keys other rows have)."""

from __future__ import annotations

import json
import random
import re

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mlflow_ragjudge as rj
from mlflow_ragjudge.cli import main
from mlflow_ragjudge.cli.reading import read_table

LEXICAL = ["--metrics", "lexical", "--config", '{"bertscore": false}']


def _last_run_table():
    import mlflow

    run = mlflow.search_runs(search_all_experiments=True, output_format="list", order_by=["start_time DESC"])[0]
    return run, rj.load_output(run.info.run_id).table


def test_csv_with_numeric_answers_and_ids_is_read_as_written_and_evaluated(tmp_path, tmp_tracking, capsys):
    path = tmp_path / "numbers.csv"
    path.write_text("row_id,question,answer,reference\n"
                    "007,What is six times seven?,42,42\n"
                    "010,What is pi to two places?,3.10,3.14\n"
                    "2,How many moons has Mars?,2,2\n", encoding="utf-8")
    frame = read_table(path)
    assert frame["row_id"].tolist() == ["007", "010", "2"]
    assert frame["answer"].tolist() == ["42", "3.10", "2"] and frame["reference"].tolist() == ["42", "3.14", "2"]
    # before: the answer column came back as numbers and the run was refused (exit 2: "holds a float ... must be
    # text"), and no edit of the file could fix it
    assert main(["evaluate", str(path), *LEXICAL]) == 0, capsys.readouterr().err
    _, table = _last_run_table()
    assert table["row_id"].astype(str).tolist() == ["007", "010", "2"]
    assert table["answer"].tolist() == ["42", "3.10", "2"]


def test_csv_text_columns_under_col_mapping_are_text_too(tmp_path, tmp_tracking, capsys):
    path = tmp_path / "mapped.csv"
    path.write_text("id,q,response,gold\n001,Year of the moon landing?,1969,1969\n"
                    "002,Boiling point of water in C?,100,100\n", encoding="utf-8")
    assert main(["evaluate", str(path), *LEXICAL, "--col", "answer=response", "--col", "reference=gold",
                 "--col", "question=q", "--col", "row_id=id"]) == 0, capsys.readouterr().err
    run, table = _last_run_table()
    assert table["row_id"].astype(str).tolist() == ["001", "002"]
    assert run.data.metrics["rougeL/mean"] == 1.0


def test_jsonl_with_numeric_answers_is_read_as_written_and_evaluated(tmp_path, tmp_tracking, capsys):
    path = tmp_path / "numbers.jsonl"
    path.write_text('{"question": "What is six times seven?", "answer": 42, "reference": 42, "row_id": 7}\n'
                    '{"question": "A price?", "answer": 4.50, "reference": "4.50", "row_id": "b", "human": 5}\n',
                    encoding="utf-8")
    frame = read_table(path)
    assert frame["answer"].tolist() == ["42", "4.50"]  # the number's own text, not str(4.5)
    assert frame["reference"].tolist() == ["42", "4.50"]
    assert frame["human"].dropna().tolist() == [5]  # not a text column: stays a number
    assert main(["evaluate", str(path), *LEXICAL]) == 0, capsys.readouterr().err
    run, table = _last_run_table()
    assert table["answer"].tolist() == ["42", "4.50"]
    assert run.data.metrics["rougeL/mean"] == 1.0


def _retrieval_rows() -> list[dict]:
    return [
        {"question": "q1", "retrieved_doc_ids": ["a", "b", "c"], "relevant_doc_ids": {"a": 2, "c": 1}},
        {"question": "q2", "retrieved_doc_ids": ["d", "e"], "relevant_doc_ids": {"e": 3}},
        {"question": "q3", "retrieved_doc_ids": ["f", "a"], "relevant_doc_ids": {"f": 1, "g": 2}},
    ]


def test_parquet_struct_grades_with_missing_keys_are_each_rows_own_dict(tmp_path, tmp_tracking, capsys):
    rows = _retrieval_rows()
    pq_path, jsonl_path = tmp_path / "grades.parquet", tmp_path / "grades.jsonl"
    pd.DataFrame(rows).to_parquet(pq_path)
    assert pa.types.is_struct(pq.read_schema(pq_path).field("relevant_doc_ids").type)  # what pandas writes
    frame = read_table(pq_path)
    # before: {"a": 2, "c": 1, "e": None, "f": None, "g": None} and the run was refused ("grades ... not numbers")
    assert frame["relevant_doc_ids"].tolist() == [r["relevant_doc_ids"] for r in rows]
    assert main(["evaluate", str(pq_path), "--metrics", "retrieval", "--k", "1,3"]) == 0, capsys.readouterr().err
    from_parquet, _ = _last_run_table()
    jsonl_path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    assert main(["evaluate", str(jsonl_path), "--metrics", "retrieval", "--k", "1,3"]) == 0
    from_jsonl, _ = _last_run_table()
    retrieval = {k: v for k, v in from_jsonl.data.metrics.items() if k.startswith(("ndcg", "recall", "map", "mrr"))}
    assert retrieval and all(from_parquet.data.metrics[k] == v for k, v in retrieval.items())


def test_parquet_map_grades_and_numeric_text_columns(tmp_path):
    table = pa.table({
        "question": ["q1", "q2"],
        "answer": pa.array([42, None], type=pa.int64()),
        "retrieved_doc_ids": pa.array([[7, 8], [9]], type=pa.list_(pa.int64())),
        "relevant_doc_ids": pa.array([[("7", 2)], [("9", 1), ("10", 3)]], type=pa.map_(pa.string(), pa.int64())),
    })
    path = tmp_path / "m.parquet"
    pq.write_table(table, path)
    frame = read_table(path)
    assert frame["answer"].tolist()[0] == "42" and pd.isna(frame["answer"].tolist()[1])
    assert frame["retrieved_doc_ids"].tolist() == [["7", "8"], ["9"]]  # ids as text: the grades' keys match them
    assert frame["relevant_doc_ids"].tolist() == [{"7": 2}, {"9": 1, "10": 3}]


# --------------------------------------------------------------------------- property-style: many generated files

_POOL = ["007", "42", "-1", "0", "3.10", "1e5", "2.50", "true", "NaN", "null", "NA", "x y", "٣", " 12", "0x1F",
         "1_000", "+3", ".5", "Paris", "1,5", '"quoted"', "00"]
_JSON_NUMBER = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?")


def _generated(seed: int) -> tuple[pd.DataFrame, dict[str, list[str]], list[dict]]:
    rnd = random.Random(seed)
    n = rnd.randint(2, 12)
    ints = [str(rnd.randint(-500, 500)) for _ in range(n)]  # a column pandas and pyarrow both type as int64
    text = {"question": [rnd.choice(_POOL) + "?" * rnd.randint(0, 1) for _ in range(n)],
            "answer": [rnd.choice(_POOL) for _ in range(n)] if seed % 2 else ints,
            "reference": [rnd.choice(_POOL) for _ in range(n)],
            "row_id": [f"{i:0{rnd.randint(1, 4)}d}" for i in range(n)]}
    keys = ["d1", "d2", "d3", "d4"]
    grades = [{k: rnd.randint(0, 3) for k in rnd.sample(keys, rnd.randint(1, 3))} for _ in range(n)]
    return pd.DataFrame(text), text, grades


@pytest.mark.parametrize("seed", range(12))
def test_generated_files_read_back_as_written_in_every_format(tmp_path, seed):
    frame, text, grades = _generated(seed)
    labels = [float(i % 5 + 1) for i in range(len(frame))]
    # CSV, as pandas writes it
    csv = tmp_path / "d.csv"
    frame.assign(human=labels).to_csv(csv, index=False)
    got = read_table(csv)
    for col, values in text.items():
        assert got[col].tolist() == values, (col, "csv")
    assert got["human"].tolist() == labels
    # JSONL: a value that is a JSON number literal written as one (unquoted), the rest as strings
    lines = []
    for i in range(len(frame)):
        parts = [f"{json.dumps(col)}: {v if _JSON_NUMBER.fullmatch(v) else json.dumps(v)}"
                 for col, v in ((c, text[c][i]) for c in text)]
        parts.append(f'"relevant_doc_ids": {json.dumps(grades[i])}')
        lines.append("{" + ", ".join(parts) + "}")
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(lines), encoding="utf-8")
    got = read_table(jsonl)
    for col, values in text.items():
        assert got[col].tolist() == values, (col, "jsonl")
    assert got["relevant_doc_ids"].tolist() == grades
    # Parquet: every column as pandas writes it (an all-integer column as int64), grades as a struct
    typed = {c: [int(v) for v in vs] if all(v == str(int(v)) for v in vs if v.lstrip("-").isdigit())
             and all(v.lstrip("-").isdigit() for v in vs) else vs for c, vs in text.items()}
    parquet = tmp_path / "d.parquet"
    pd.DataFrame({**typed, "relevant_doc_ids": grades}).to_parquet(parquet)
    got = read_table(parquet)
    for col, values in text.items():
        assert got[col].tolist() == values, (col, "parquet")
    assert got["relevant_doc_ids"].tolist() == grades


def test_a_number_in_a_text_column_of_a_frame_is_refused_with_the_fix(fake_llm):
    """In Python the frame is taken as given: a number where text belongs is refused before any call, and the
    error names the column, the value and the conversion that fixes it."""
    frame = pd.DataFrame({"question": ["q"], "answer": [42], "reference": [7]})
    with pytest.raises(rj.InputError, match=r"Column 'answer' row 0 holds a int \('42'\).*astype\(str\)"):
        rj.evaluate_frame(frame, metrics=["lexical"], bertscore=False)
    with pytest.raises(rj.InputError, match=r"Column 'reference' row 0 holds a int \('7'\).*astype\(str\)"):
        rj.evaluate_frame(frame.assign(answer="42"), metrics=["lexical"], bertscore=False)
    assert fake_llm.request_count == 0
    # converted as the fix says, the same frame runs
    out = rj.evaluate_frame(frame.astype(str), metrics=["lexical"], bertscore=False)
    assert out.metrics["rougeL/mean"] == 0.0
