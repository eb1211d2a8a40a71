"""The table and the JSON document."""

from __future__ import annotations

import json

from train.doctor.rows import FAIL, OK, WARN, Check, format_table, render


def test_table_shows_fixes_under_warn_and_fail_only():
    rows = [Check("a", OK, "fine", "never shown"), Check("bb", WARN, "hm", "do x"), Check("c", FAIL, "bad", "do y")]
    table = format_table(rows)
    assert "never shown" not in table and "fix: do x" in table and "fix: do y" in table
    assert table.endswith("1 FAIL, 1 WARN: fix the FAIL rows before starting the job.")
    assert "\033[31m" in format_table(rows, colour=True)


def test_json_document_carries_the_data():
    document = json.loads(render([Check("gpus", OK, "1 GPU", data={"uuids": ["GPU-1"]})], "json"))
    assert document == {
        "checks": [{"name": "gpus", "status": "OK", "detail": "1 GPU", "fix": "", "data": {"uuids": ["GPU-1"]}}],
        "ok": True,
    }
