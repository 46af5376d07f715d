"""Reading what the user gives the CLI: data files (JSONL, CSV, Parquet), corpora, grid files, and their
pipeline or retriever as ``module:function`` or ``path/to/file.py:function``."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pandas as pd

from ..core.errors import InputError


def _clean(value: Any, counter: list[int]) -> Any:
    """Lone surrogates (``"\\ud800"`` escapes) replaced in every string of a parsed JSON value."""
    from ..core.text import clean_text

    if isinstance(value, str):
        value, n = clean_text(value)
        counter[0] += n
        return value
    if isinstance(value, list):
        return [_clean(v, counter) for v in value]
    if isinstance(value, dict):
        return {_clean(k, counter): _clean(v, counter) for k, v in value.items()}
    return value

#: logical columns that hold text: read as str whatever type the file (or pandas, or pyarrow) gives them, so an
#: answer "42" or a row id "007" is the text the user wrote, not a number
TEXT_COLUMNS = ("question", "answer", "reference", "row_id", "group", "raw_output")
#: logical columns that hold lists of text (passages) or of document ids: their scalar items are read as str too,
#: so that ids written 7 in one list and "7" in another (or as a dict's key) are the same document
TEXT_LIST_COLUMNS = ("contexts", "reference_contexts", "evidence_contexts", "gold_documents", "retrieved_doc_ids",
                     "relevant_doc_ids", "citations")


class _Number:
    """A number from a JSON file with the text it was written as: the text in a text column, the number elsewhere."""

    __slots__ = ("text", "value")

    def __init__(self, text: str, value: int | float) -> None:
        self.text, self.value = text, value


def _json_number_hooks() -> dict[str, Any]:
    return {"parse_int": lambda t: _Number(t, int(t)), "parse_float": lambda t: _Number(t, float(t))}


def _as_written(value: Any, *, text: bool) -> Any:
    """A parsed JSON value with each :class:`_Number` replaced by its text (``text``) or its value."""
    if isinstance(value, _Number):
        return value.text if text else value.value
    if isinstance(value, list):
        return [_as_written(v, text=text) for v in value]
    if isinstance(value, dict):
        return {k: _as_written(v, text=text) for k, v in value.items()}
    return value


def _text_names(col_mapping: dict[str, str] | None) -> tuple[set[str], set[str]]:
    """The file's column names that hold text and lists of text, under ``col_mapping`` (logical -> file column)."""
    mapping = col_mapping or {}
    return ({mapping.get(c, c) for c in TEXT_COLUMNS}, {mapping.get(c, c) for c in TEXT_LIST_COLUMNS})


def _json_row(value: dict[str, Any], text: set[str], lists: set[str]) -> dict[str, Any]:
    return {k: _as_written(v, text=k in text or (k in lists and isinstance(v, list))) for k, v in value.items()}


def _read_jsonl(p: Path, col_mapping: dict[str, str] | None = None, *, also_text: tuple[str, ...] = ()
                ) -> list[dict[str, Any]]:
    """JSON Lines, one object per line; a line that is not an object is an error naming the line. Invalid
    Unicode (lone surrogates) is replaced with U+FFFD, with a warning naming the lines. A number in a text column
    (``{"answer": 42}``) is read as the text it was written as (``"42"``); numbers elsewhere stay numbers."""
    from ..core.errors import InvalidTextWarning

    text, lists = _text_names(col_mapping)
    text |= set(also_text)
    rows: list[dict[str, Any]] = []
    repaired: list[int] = []
    with open(p, encoding="utf-8", errors="surrogateescape") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line, **_json_number_hooks())
            except ValueError as e:
                raise InputError(f"{p.name} line {n} is not valid JSON ({e}); each line must be one JSON object, "
                                 'e.g. {"question": "...", "answer": "...", "reference": "..."}.') from None
            if not isinstance(value, dict):
                raise InputError(f"{p.name} line {n} is a JSON {type(value).__name__}, not an object; each line must "
                                 'be one row as an object, e.g. {"question": "...", "answer": "..."}.')
            counter = [0]
            rows.append(_clean(_json_row(value, text, lists), counter))
            if counter[0]:
                repaired.append(n)
    if not rows:
        raise InputError(f"{p.name} has no rows.")
    if repaired:
        warnings.warn(f"{p.name}: invalid characters (lone surrogates, which UTF-8 cannot encode) were replaced with "
                      f"U+FFFD on line(s) {repaired[:10]}{' ...' if len(repaired) > 10 else ''}.",
                      InvalidTextWarning, stacklevel=2)
    return rows


def _read_parquet(p: Path, col_mapping: dict[str, str] | None) -> pd.DataFrame:
    """A Parquet file with text columns as str (a number column cast to its text by Arrow: 42 -> "42", nulls kept),
    the scalar items of list-of-text columns as str, and struct and map columns (a dict of grades) as plain dicts
    of the keys each row has: Arrow gives a struct every key of every row, None where a row had none."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(p)
    text, lists = _text_names(col_mapping)
    for i, field in enumerate(table.schema):
        if field.name in text and (pa.types.is_integer(field.type) or pa.types.is_floating(field.type)
                                   or pa.types.is_decimal(field.type) or pa.types.is_boolean(field.type)):
            table = table.set_column(i, field.name, pc.cast(table.column(i), pa.string()))
    frame = table.to_pandas()
    for field in table.schema:
        name = field.name
        if pa.types.is_struct(field.type):  # from Arrow's own values: a grade written 2 stays 2, not 2.0
            frame[name] = [{k: v for k, v in cell.items() if v is not None} if isinstance(cell, dict) else cell
                           for cell in table.column(name).to_pylist()]
        elif pa.types.is_map(field.type):
            frame[name] = [{str(k): v for k, v in cell} if isinstance(cell, list) else cell
                           for cell in table.column(name).to_pylist()]
        elif name in lists:
            frame[name] = [_text_items(cell) for cell in frame[name]]
    return frame


def _text_items(cell: Any) -> Any:
    """A list cell with its numbers as text (ids 7 and "7" are the same id; a passage 42 is the text "42")."""
    if hasattr(cell, "tolist") and not isinstance(cell, (str, bytes)):
        cell = cell.tolist()
    if not isinstance(cell, list):
        return cell
    return [str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in cell]


def read_table(path: str | Path, col_mapping: dict[str, str] | None = None) -> pd.DataFrame:
    """Read a dataset file: ``.jsonl``/``.json``, ``.csv`` or ``.parquet``.

    Text columns (question, answer, reference, row_id, group, raw_output; under ``col_mapping``'s names) are read
    as the text the user wrote, whatever type pandas or pyarrow would infer: a CSV answer ``42`` is ``"42"``, a row
    id ``007`` stays ``"007"``, a JSON ``{"answer": 4.50}`` is ``"4.50"``, a Parquet int column ``"42"``. Numbers in
    passage and id lists are read as text too. A Parquet struct column (a dict of grades) keeps only the keys each
    row has. Every other column (human labels, grades, flags) keeps its numbers.

    Raises:
        InputError: the file is missing, of an unknown type, or not readable as that type (the message
            names the line or the problem).
    """
    p = Path(path)
    if not p.is_file():
        raise InputError(f"No such file: {p}")
    suffix = p.suffix.lower()
    try:
        if suffix in (".jsonl", ".ndjson"):
            return pd.DataFrame(_read_jsonl(p, col_mapping))
        if suffix == ".json":
            data = json.loads(p.read_text(encoding="utf-8"), **_json_number_hooks())
            if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
                raise InputError(f"{p.name} must hold a JSON list of row objects; for one object per line use .jsonl.")
            text, lists = _text_names(col_mapping)
            return pd.DataFrame([_json_row(r, text, lists) for r in data])
        if suffix == ".csv":
            header = pd.read_csv(p, nrows=0, keep_default_na=False).columns
            text, lists = _text_names(col_mapping)
            return pd.read_csv(p, keep_default_na=False, na_values=[""],
                               dtype={c: str for c in header if c in text or c in lists})
        if suffix in (".parquet", ".pq"):
            return _read_parquet(p, col_mapping)
    except InputError:
        raise
    except (ValueError, OSError, UnicodeDecodeError) as e:
        raise InputError(f"{p.name} could not be read as {suffix} ({type(e).__name__}: {e}).") from None
    raise InputError(f"{p.name}: unsupported file type {suffix!r}; use .jsonl, .csv or .parquet")

#: what DATA can be with --spark, said in every error about it
SPARK_DATA = ("with --spark, DATA is a Parquet file, a folder of Parquet files (as Spark writes them), a URI Spark "
              "reads (s3a://..., hdfs://..., file:///...) or a table of the Spark session's catalog")
#: name endings that make DATA a file, not a table name (``db.table`` is a table; ``rows.jsonl`` is not)
_FILE_SUFFIXES = (".parquet", ".pq", ".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".txt")
#: the four bytes a Parquet file starts and ends with
_PARQUET_MAGIC = b"PAR1"


def spark_data_kind(data: str) -> str:
    """What ``ragjudge evaluate DATA --spark`` reads DATA as: ``"path"`` (Parquet, read with ``spark.read.parquet``)
    or ``"table"`` (``spark.table``). A local path is checked here, before any Spark session or job: it must exist and
    hold Parquet (a file, or a folder whose data files -- the names Spark reads: not starting with ``_`` or ``.``, not
    empty -- are all Parquet); so is a ``file://`` URI. Any other URI (``s3a://``, ``hdfs://`` ...) is left to Spark.

    Raises:
        InputError: a missing path, a file that is not Parquet (a .jsonl, a .csv ...), a folder with no Parquet files
            or with other files; the message names the path and what to do.
    """
    if data.startswith("file://"):
        path = Path(unquote(urlparse(data).path))
    elif "://" in data:
        return "path"
    else:
        path = Path(data)
    if not path.exists():
        if "/" in data or os.sep in data or path.suffix.lower() in _FILE_SUFFIXES:  # a path, not a table's name
            raise InputError(f"No such file or directory: {data} ({SPARK_DATA}).")
        return "table"
    if path.is_file():
        if not _is_parquet(path):
            raise InputError(f"{data} is not a Parquet file{_its_kind(path)}; {SPARK_DATA}. {_without_spark(path)}")
        return "path"
    files = sorted(_spark_files(path))
    if not files:
        raise InputError(f"{data} is a folder with no Parquet files in it; {SPARK_DATA}.")
    other = next((f for f in files if not _is_parquet(f)), None)
    if other is not None:
        raise InputError(f"{data} holds a file that is not Parquet: {other.relative_to(path)}{_its_kind(other)}; "
                         f"{SPARK_DATA}. Keep only the Parquet parts in the folder, or point DATA at one file.")
    return "path"


def check_spark_output(target: str) -> None:
    """``--spark-output TARGET``, checked before the Spark session starts (and so before any judge call): Spark
    writes a folder of Parquet files there after the run, replacing what is there. A local path (or ``file://`` URI)
    must be writable: its nearest existing folder takes a new entry, and what is there already is a folder Spark
    wrote (Parquet parts) or nothing -- never a file or a folder of the user's other files, which the write would
    delete. Any other URI (``s3a://``, ``hdfs://`` ...) is left to Spark.

    Raises:
        InputError: the message names the path, why it cannot be written and what to do.
    """
    if target.startswith("file://"):
        path = Path(unquote(urlparse(target).path))
    elif "://" in target:
        return
    else:
        path = Path(target)
    why = _unwritable(path)
    if why:
        raise InputError(f"--spark-output {target}: {why}. Nothing was sent to the judge; name a new folder (Spark "
                         "writes every row with its results there as Parquet files).")


def _unwritable(path: Path) -> str | None:
    """Why Spark could not write its output folder at ``path`` (or must not: it would replace the user's files)."""
    if path.is_file() or (path.exists() and not path.is_dir()):
        return "it is a file, not a folder (Spark's write would replace it)"
    if path.is_dir():
        other = next((f for f in _spark_files(path) if not _is_parquet(f)), None)
        if other is not None:
            return (f"the folder holds files Spark did not write ({other.relative_to(path)}); the write would delete "
                    "them")
    at = path if path.is_dir() else path.parent
    while not at.exists() and at != at.parent:
        at = at.parent
    if not at.is_dir():
        return f"{at} is a file, so no folder can be made under it"
    try:  # (what the permissions say is not enough: a read-only file system, or root)
        Path(tempfile.mkdtemp(prefix=".ragjudge-probe-", dir=at)).rmdir()
    except OSError as e:
        return f"{at} cannot be written ({e.strerror or type(e).__name__})"
    return None


def _spark_files(folder: Path) -> list[Path]:
    """The files Spark reads in a folder, as its file index lists them: recursively (``key=value`` partition folders
    included), skipping names that start with ``_`` or ``.`` (``_SUCCESS``, ``.crc`` checksums) and empty files."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        for name in names:
            f = Path(root) / name
            if not name.startswith(("_", ".")) and f.stat().st_size > 0:
                found.append(f)
    return found


def _is_parquet(path: Path) -> bool:
    """Whether the file has Parquet's mark at both ends (what Spark's reader checks first)."""
    try:
        with path.open("rb") as f:
            head = f.read(4)
            f.seek(0, os.SEEK_END)
            if f.tell() < 12:  # the two marks and the footer's length: no Parquet file is shorter
                return False
            f.seek(-4, os.SEEK_END)
            return head == _PARQUET_MAGIC and f.read(4) == _PARQUET_MAGIC
    except OSError:
        return False


def _its_kind(path: Path) -> str:
    suffix = path.suffix.lower()
    return f" (a {suffix} file)" if suffix and suffix not in (".parquet", ".pq") else ""


def _without_spark(path: Path) -> str:
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json", ".csv"):
        return "Drop --spark to evaluate it in one process, or write it as Parquet for Spark (pandas: to_parquet)."
    return "Write it as Parquet for Spark (pandas: to_parquet)."


def read_corpus(path: str) -> dict[str, str]:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"No such file: {p}")
    if p.suffix.lower() in (".jsonl", ".ndjson"):
        rows = _read_jsonl(p, also_text=("id", "text"))
        missing = [i for i, r in enumerate(rows) if "id" not in r or not isinstance(r.get("text"), str)]
        if missing:
            raise InputError(f"{p.name} row {missing[0] + 1} needs an 'id' and a 'text' (str) field")
        return {str(r["id"]): r["text"] for r in rows}
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except ValueError as e:
        raise InputError(f"{p.name} is not valid JSON ({e}).") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise InputError(f"{p.name} must be a JSON object {{doc_id: text}} with text values")
    return {str(k): v for k, v in data.items()}

def import_callable(spec: str, what: str) -> Any:
    """``module:function`` (importable from the current directory) or ``path/to/file.py:function``.

    A file is loaded as Python runs a script: its own directory goes first on the import path, so it can import
    the modules beside it. Any failure to import it (a missing module, a syntax error, an exception at import) is
    a :class:`ValueError` naming the file or module and the error, which the CLI turns into exit 2.
    """
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--{what} {spec!r}: give MODULE:FUNCTION, e.g. my_rag:answer")
    module = import_module_or_file(module_name, spec, what)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"--{what} {spec!r}: {module_name} has no function {attr!r}")
    return fn


def load_plugins(specs: list[str] | None) -> list[str]:
    """Import each ``--plugin`` (a module importable from the current directory, or ``path/to/file.py``) for what
    it registers at import (``register_metric(...)``: docs/extending.md); returns the metrics that appeared."""
    from ..metrics.spec import metric_names

    before = set(metric_names())
    for spec in specs or []:
        import_module_or_file(spec, spec, "plugin")
    return [m for m in metric_names() if m not in before]


def import_module_or_file(module_name: str, spec: str, what: str) -> Any:
    """The module ``module_name`` names (dotted, importable from the current directory, or a ``.py`` path); a
    failure is a :class:`ValueError` that starts ``--<what> <spec>:`` and names the file, line and error."""
    import importlib
    import importlib.util
    import traceback

    def failed(where: str, e: BaseException) -> ValueError:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if "importlib" not in f.filename]
        at = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
        if isinstance(e, SyntaxError) and e.filename:
            at = f" at {Path(e.filename).name}:{e.lineno}"
        hint = ""
        if isinstance(e, ModuleNotFoundError):
            hint = (f"; install {e.name!r} in this environment ({sys.executable} -m pip install ...) or put the module "
                    f"beside the {what} file")
        return ValueError(f"--{what} {spec!r}: importing {where} failed{at}: {type(e).__name__}: {e}{hint}")

    if module_name.endswith(".py"):
        path = Path(module_name).expanduser()
        if not path.is_file():
            raise ValueError(f"--{what} {spec!r}: no such file {path}")
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)  # as `python path/to/file.py` does: the modules beside it import
        name = f"_ragjudge_{what}_{path.stem}"
        if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path.resolve()):
            return sys.modules[name]  # loaded already (main() called twice in one process): register once
        loader_spec = importlib.util.spec_from_file_location(name, path.resolve())
        if loader_spec is None or loader_spec.loader is None:
            raise ValueError(f"--{what} {spec!r}: cannot load {path}")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module  # pickling, dataclasses and typing look the module up by name
        try:
            loader_spec.loader.exec_module(module)
        except Exception as e:
            sys.modules.pop(name, None)
            raise failed(str(path), e) from None
        return module
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.split(".")[0] == e.name.split(".")[0]:
            raise ValueError(f"--{what} {spec!r}: no module {module_name!r} here ({e}); run from the directory "
                             "that holds it, or give path/to/file.py") from None
        raise failed(f"module {module_name!r}", e) from None
    except Exception as e:
        raise failed(f"module {module_name!r}", e) from None


def read_grid(path: str | Path) -> Any:
    """A grid file (JSON, or YAML for .yaml/.yml): a list of parameter dicts or ``{param: [values]}``; a value
    ``{"name": ..., "template": ...}`` is a :class:`~mlflow_ragjudge.sweep.PromptTemplate`."""
    from ..workflows.sweep import PromptTemplate

    p = Path(path)
    if not p.is_file():
        raise InputError(f"No such grid file: {p}")
    text = p.read_text(encoding="utf-8")
    try:
        if p.suffix.lower() in (".yaml", ".yml"):
            import yaml

            grid = yaml.safe_load(text)
        else:
            grid = json.loads(text)
    except Exception as e:
        raise InputError(f"{p.name} could not be read ({type(e).__name__}: {e}).") from None

    def convert(v: Any) -> Any:
        if isinstance(v, dict) and {"name", "template"} <= set(v) and set(v) <= {"name", "template", "commit_message"}:
            return PromptTemplate(v["name"], v["template"], v.get("commit_message"))
        return v

    if isinstance(grid, dict):
        return {k: [convert(x) for x in vals] if isinstance(vals, list) else vals for k, vals in grid.items()}
    if isinstance(grid, list):
        return [{k: convert(x) for k, x in v.items()} if isinstance(v, dict) else v for v in grid]
    raise InputError(f"{p.name} must hold a list of parameter dicts or a grid {{param: [values]}}.")
