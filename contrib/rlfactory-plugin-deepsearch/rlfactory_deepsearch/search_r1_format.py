"""Search-R1's file formats: its question parquet files and its wiki-18 passage corpus.

Questions. Search-R1 (github.com/PeterGriffinJin/Search-R1) turns FlashRAG's NQ/HotpotQA
rows (``id``, ``question``, ``golden_answers``) into verl parquet files with
``scripts/data_process/nq_search.py`` and ``qa_search_train_merge.py``. ``datasets.map`` keeps
the original columns and adds:

* ``data_source``: ``"nq"``, ``"hotpotqa"`` ...;
* ``prompt``: ``[{"role": "user", "content": <instruction> + "Question: " + question + "\\n"}]``;
* ``ability``: ``"fact-reasoning"``;
* ``reward_model``: ``{"style": "rule", "ground_truth": {"target": golden_answers}}``;
* ``extra_info``: ``{"split": "train" | "test", "index": i}``.

:func:`load_search_r1_parquet` reads such a file into our samples, ``{"id", "question",
"golden_answers", "answer", "data_source"}`` (plus ``extra_info`` when there is one), taking
the question from the ``question`` column or, when a file has only the prompt, from the text
after its last ``Question:``; the answers from ``reward_model.ground_truth.target`` (what
Search-R1's reward reads) or ``golden_answers``. :func:`write_search_r1_parquet` writes the
same schema, so our dataset trains in Search-R1 itself.

Corpus. wiki-18 (``wiki-18.jsonl``) is one JSON object a line, ``{"id": "0", "contents":
"\\"Title\\"\\ntext"}``. :func:`split_title` and :func:`check_corpus_row` give its rules to the
dataset builder and the retrievers; :func:`iter_wiki_corpus` streams a file.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from rlfactory_core import RLFactoryError

__all__ = [
    "SEARCH_R1_PREFIX",
    "search_r1_prompt",
    "load_search_r1_parquet",
    "samples_from_search_r1_rows",
    "write_search_r1_parquet",
    "split_title",
    "check_corpus_row",
    "iter_wiki_corpus",
]

#: The instruction of Search-R1's ``make_prefix`` (template ``base``) before ``{question}``.
SEARCH_R1_PREFIX = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
    "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
    "engine by <search> query </search> and it will return the top searched results between <information> "
    "and </information>. You can search as many times as your want. If you find no further external "
    "knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

_QUESTION_MARKER = "Question:"
_PARQUET_HINT = ("a Search-R1 file has 'prompt' or 'question', and 'reward_model' (ground_truth.target) or "
                 "'golden_answers'; see Search-R1's scripts/data_process/nq_search.py")
CORPUS_HINT = 'each line must be a JSON object {"id": "...", "contents": "\\"Title\\"\\ntext"} (wiki-18 format)'


# --------------------------------------------------------------------------- questions


def search_r1_prompt(sample: Mapping[str, Any]) -> str:
    """Search-R1's prompt for ``sample``: its instruction, then ``Question: <question>``."""
    return SEARCH_R1_PREFIX.format(question=sample["question"])


def _plain(value: Any) -> Any:
    """``value`` with numpy arrays and scalars (what pandas gives for parquet lists) turned into
    Python lists and numbers, recursively."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return _plain(value.tolist())
    return value


def _answer_list(value: Any, where: str) -> list[str] | None:
    """Gold answers as a list of non-empty strings; None when ``value`` is missing. A single
    string is one answer (Search-R1's reward accepts that too)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise RLFactoryError(f"{where}: gold answers must be a list of strings, got {type(value).__name__}",
                             hint=_PARQUET_HINT)
    answers = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (str, int, float, type(None))):
            raise RLFactoryError(f"{where}: a gold answer must be a string, got {type(item).__name__} {item!r}",
                                 hint=_PARQUET_HINT)
        if item is not None and str(item).strip():
            answers.append(str(item).strip())
    if not answers:
        raise RLFactoryError(f"{where}: the list of gold answers is empty", hint="every question needs an answer")
    return answers


def _question_from_prompt(prompt: Any, where: str) -> str:
    """The text after the last ``Question:`` of the prompt's last user message."""
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        text = users[-1] if users and isinstance(users[-1], str) else ""
    else:
        text = ""
    _, marker, question = text.rpartition(_QUESTION_MARKER)
    if not marker or not question.strip():
        raise RLFactoryError(f"{where}: no 'question' column and no '{_QUESTION_MARKER} ...' in the prompt's user "
                             "message to take the question from", hint=_PARQUET_HINT)
    return question.strip()


def samples_from_search_r1_rows(rows: Iterable[Mapping[str, Any]], source: str = "rows") -> list[dict[str, Any]]:
    """Our samples from Search-R1 rows (dicts with its columns, from pyarrow or pandas).

    :param rows: the rows, in order; numpy arrays in them are fine.
    :param source: how errors name the rows' origin, e.g. the file path.
    :raises RLFactoryError: naming the row (0-based) that has no question or no gold answer.
    """
    samples = []
    for index, raw in enumerate(rows):
        where = f"{source}: row {index}"
        if not isinstance(raw, Mapping):
            raise RLFactoryError(f"{where} is a {type(raw).__name__}, not a mapping of column to value",
                                 hint="pass rows as dicts, e.g. pyarrow's Table.to_pylist()")
        row = _plain(dict(raw))
        question = row.get("question")
        if not isinstance(question, str) or not question.strip():
            question = _question_from_prompt(row.get("prompt"), where)
        reward_model = row.get("reward_model") if isinstance(row.get("reward_model"), dict) else {}
        ground_truth = reward_model.get("ground_truth") if isinstance(reward_model.get("ground_truth"), dict) else {}
        answers = _answer_list(ground_truth.get("target"), where)
        if answers is None:
            answers = _answer_list(row.get("golden_answers"), where)
        if answers is None:
            raise RLFactoryError(f"{where}: no gold answers (neither reward_model.ground_truth.target nor "
                                 "golden_answers)", hint=_PARQUET_HINT)
        data_source = row.get("data_source") if isinstance(row.get("data_source"), str) else "search_r1"
        extra_info = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else None
        sample_id = row.get("id")
        if not isinstance(sample_id, (str, int)) or isinstance(sample_id, bool) or str(sample_id) == "":
            if extra_info and "index" in extra_info:
                sample_id = f"{data_source}-{extra_info.get('split', 'data')}-{extra_info['index']}"
            else:
                sample_id = f"{data_source}-{index}"
        sample = {"id": str(sample_id), "question": question.strip(), "golden_answers": answers,
                  "answer": answers[0], "data_source": data_source}
        if extra_info is not None:
            sample["extra_info"] = extra_info
        samples.append(sample)
    return samples


def load_search_r1_parquet(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The samples of a Search-R1 parquet file (``nq_search.py``'s ``train.parquet`` ...).

    :raises RLFactoryError: when the file cannot be read, lacks the columns (naming them), or a
        row has no question or gold answer (naming the row, 0-based).
    """
    import pyarrow.parquet as pq

    path = Path(path).expanduser()
    if not path.is_file():
        raise RLFactoryError(f"no Search-R1 parquet file at {path}",
                             hint="make one with Search-R1's scripts/data_process/nq_search.py, or pass a JSONL file")
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError ... for a file that is not parquet
        raise RLFactoryError(f"{path} is not a readable parquet file ({exc})", hint=_PARQUET_HINT) from None
    columns = set(table.column_names)
    missing = [need for need in (("question", "prompt"), ("reward_model", "golden_answers"))
               if not columns & set(need)]
    if missing:
        wanted = " and ".join(" or ".join(repr(c) for c in need) for need in missing)
        raise RLFactoryError(f"{path} is not a Search-R1 file: it has no {wanted} column "
                             f"(columns: {', '.join(sorted(columns)) or 'none'})", hint=_PARQUET_HINT)
    return samples_from_search_r1_rows(table.to_pylist(), source=str(path))


def write_search_r1_parquet(samples: Iterable[Mapping[str, Any]], path: str | os.PathLike,
                            prompt_builder: Callable[[Mapping[str, Any]], str] | None = None,
                            split: str = "train") -> Path:
    """Write ``samples`` as a Search-R1 parquet file (the columns of ``nq_search.py``).

    :param samples: dicts with ``question`` and ``golden_answers`` (or ``answer``); ``id`` and
        ``data_source`` are kept when present.
    :param path: the file to write (replaced atomically).
    :param prompt_builder: the user message of each sample (default :func:`search_r1_prompt`).
    :param split: ``extra_info.split`` of every row.
    :returns: ``path``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    build_prompt = prompt_builder or search_r1_prompt
    columns: dict[str, list[Any]] = {name: [] for name in ("id", "question", "golden_answers", "data_source",
                                                           "prompt", "ability", "reward_model", "extra_info")}
    for index, sample in enumerate(samples):
        where = f"sample {index}"
        question = sample.get("question")
        if not isinstance(question, str) or not question.strip():
            raise RLFactoryError(f"{where}: no question", hint="every sample needs a non-empty 'question'")
        answers = _answer_list(_plain(sample.get("golden_answers")), where)
        if answers is None:
            answers = _answer_list(_plain(sample.get("answer")), where)
        if answers is None:
            raise RLFactoryError(f"{where}: no gold answers", hint="give it 'golden_answers' (a list) or 'answer'")
        prompt = build_prompt(sample)
        if not isinstance(prompt, str):
            raise RLFactoryError(f"{where}: prompt_builder returned {type(prompt).__name__}, not a string",
                                 hint="prompt_builder must return the user message's text")
        columns["id"].append(str(sample.get("id", f"{split}_{index}")))
        columns["question"].append(question)
        columns["golden_answers"].append(answers)
        columns["data_source"].append(str(sample.get("data_source", "search_r1")))
        columns["prompt"].append([{"role": "user", "content": prompt}])
        columns["ability"].append("fact-reasoning")
        columns["reward_model"].append({"style": "rule", "ground_truth": {"target": answers}})
        columns["extra_info"].append({"split": split, "index": index})
    schema = pa.schema([
        ("id", pa.string()),
        ("question", pa.string()),
        ("golden_answers", pa.list_(pa.string())),
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()),
                                    ("ground_truth", pa.struct([("target", pa.list_(pa.string()))]))])),
        ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64())])),
    ])
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        pq.write_table(pa.Table.from_pydict(columns, schema=schema), partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


# --------------------------------------------------------------------------- corpus


def split_title(contents: str) -> tuple[str, str]:
    """``(title, text)`` of a wiki-18 ``contents``: the first line, without its pair of double
    quotes, and the rest. Without a newline it is all title, as Search-R1's retrieval server
    reads it."""
    first, _, text = contents.partition("\n")
    title = first.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title, text.strip()


def check_corpus_row(row: Any, line_no: int, source: str | os.PathLike | None = None) -> str:
    """Check one parsed line of a wiki-18 corpus; returns its id as a string (wiki-18 ids are
    strings, an integer is accepted).

    :param row: the parsed JSON value.
    :param line_no: its line number (1-based), for the error.
    :param source: the file, for the error.
    :raises RLFactoryError: when it is not ``{"id": str | int, "contents": str}``.
    """
    where = f"{source}:{line_no}" if source is not None else f"line {line_no}"
    if not isinstance(row, dict):
        raise RLFactoryError(f"{where}: expected a JSON object, got {type(row).__name__}", hint=CORPUS_HINT)
    passage_id, contents = row.get("id"), row.get("contents")
    if isinstance(passage_id, int) and not isinstance(passage_id, bool):
        passage_id = str(passage_id)
    if not isinstance(passage_id, str) or not passage_id:
        raise RLFactoryError(f"{where}: 'id' must be a non-empty string, got {passage_id!r}", hint=CORPUS_HINT)
    if not isinstance(contents, str):
        raise RLFactoryError(f"{where}: 'contents' must be a string, got {contents!r}", hint=CORPUS_HINT)
    return passage_id


def iter_wiki_corpus(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Stream a wiki-18 corpus (``.jsonl`` or ``.jsonl.gz``): ``{"id", "contents", "title",
    "text", "line"}`` per passage (``line``: its line number, for errors), blank lines
    skipped, each row checked by :func:`check_corpus_row`."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise RLFactoryError(f"corpus file {path} does not exist",
                             hint="pass the path of a JSONL corpus (wiki-18 format)")
    opened = gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")
    with opened as lines:
        for line_no, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RLFactoryError(f"{path}:{line_no}: not valid JSON ({exc.msg})", hint=CORPUS_HINT) from None
            passage_id = check_corpus_row(row, line_no, path)
            title, text = split_title(row["contents"])
            yield {"id": passage_id, "contents": row["contents"], "title": title, "text": text, "line": line_no}
