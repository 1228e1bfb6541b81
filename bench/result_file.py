"""A bench run's JSON file: indented, each per-request record on one line."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any


def write_json(payload: dict[str, Any], path: Path, schema_version: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps({"schema_version": schema_version, **payload}) + "\n")
    return path


def dumps(payload: dict[str, Any]) -> str:
    """`payload` as indented JSON, but each per-request record (a `records` list's item) on one line: a run's
    thousands of records would otherwise take most of its file in indentation."""
    records: list[Any] = []

    def hold(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: [_slot(records, r) for r in v] if k == "records" and isinstance(v, list) else hold(v)
                    for k, v in value.items()}
        return [hold(v) for v in value] if isinstance(value, list) else value

    text = json.dumps(hold(payload), indent=2, default=str)
    return _RECORD.sub(lambda m: json.dumps(records[int(m.group(1))], default=str), text)


# a record's place in the indented text: a string no JSON value of the bench holds
_RECORD = re.compile(r'"\\u0000record (\d+)"')


def _slot(records: list[Any], record: Any) -> str:
    records.append(record)
    return f"\0record {len(records) - 1}"
