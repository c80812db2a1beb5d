"""Downloads of a run's data (`rlf ui`): its metrics as CSV, a filtered set of its recorded
trajectories as JSONL, its config as YAML.

Each reads what the pages read, through :class:`~rlfactory_cli.ui.runs_data.RunsData`, so the
same rules hold: a run's name is resolved inside the runs directory, a file that leads out of
it is refused, a damaged metrics line is skipped. The trajectories are the list's own filter
(:meth:`RunsData.trajectories`), each written whole (its token arrays included) as one JSON
line, NaN and infinities as null, streamed step by step.
"""

from __future__ import annotations

import csv
import io
import itertools
from typing import Any, Iterator
from urllib.parse import quote

from rlfactory_core.metrics import read_metrics

from .runs_data import RunsData

__all__ = ["metrics_csv", "trajectories_jsonl", "config_yaml", "attachment"]

#: Rows the trajectory list is asked for at once while an export walks it.
_PAGE = 1000


def attachment(filename: str) -> dict[str, str]:
    """The header that makes a browser save the response as ``filename``."""
    return {"Content-Disposition": f"attachment; filename*=UTF-8''{quote(filename, safe='')}"}


def metrics_csv(data: RunsData, name: str) -> str:
    """Every record of the run's ``metrics.jsonl`` as a CSV row, in order: ``step``, ``time``,
    then every other key in sorted order (a record without a key leaves its cell empty; a step
    with a cold start has two rows for step 0). Damaged lines are skipped, as the pages skip them."""
    run_dir = data.run_dir(name)
    records: list[dict[str, Any]] = []
    if data.readable(run_dir / "metrics.jsonl"):
        records = read_metrics(run_dir, damaged=[])
    keys = sorted({key for record in records for key in record} - {"step", "time"})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["step", "time", *keys])
    for record in records:
        writer.writerow([_cell(record.get(key)) for key in ("step", "time", *keys)])
    return out.getvalue()


def _cell(value: Any) -> Any:
    return "" if value is None else value


def trajectories_jsonl(data: RunsData, name: str, kind: str, **filters: Any) -> Iterator[bytes]:
    """The trajectories of ``kind`` the list shows for ``filters`` (those of
    :meth:`RunsData.trajectories`: ``step``, ``min_reward``, ``outcome`` ...), in its order,
    each whole as one JSON line."""
    import orjson

    offset = 0
    while True:
        page = data.trajectories(name, kind, offset=offset, limit=_PAGE, **filters)
        # the rows of one step that follow each other (all of a step's export) read its file once
        for step, rows in itertools.groupby(page["rows"], key=lambda row: row["step"]):
            for record in data.step_trajectories(name, kind, step, [row["index"] for row in rows]):
                yield orjson.dumps(record) + b"\n"
        offset += len(page["rows"])
        if not page["rows"] or offset >= page["total"]:
            return


def config_yaml(data: RunsData, name: str) -> bytes | None:
    """The run's ``config.yaml`` as it is on disk (None when there is none, or it is refused)."""
    path = data.run_dir(name) / "config.yaml"
    return path.read_bytes() if data.readable(path) else None
