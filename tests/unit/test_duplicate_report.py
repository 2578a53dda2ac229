"""The duplicate report's reading of pylint's messages (`tests.duplicate_report`)."""

from __future__ import annotations

from tests.duplicate_report import Block, blocks


def test_a_block_is_one_r0801_message_with_each_copy_and_its_lines_beyond_the_first() -> None:
    messages: list[dict[str, object]] = [
        {
            "message-id": "R0801",
            "message": "Similar lines in 3 files\n==aiolock._lua.a:[10:22]\n"
            "==aiolock._lua.b:[5:17]\n==aiolock._lua.c:[40:52]\n  local x = 1\n",
        },
        {"message-id": "C0114", "message": "Missing module docstring"},
    ]
    found = blocks(messages)
    assert found == [
        Block((("aiolock._lua.a", 10, 22), ("aiolock._lua.b", 5, 17), ("aiolock._lua.c", 40, 52)))
    ]
    assert found[0].duplicated_lines == 24  # 12 lines, twice beyond the first copy
