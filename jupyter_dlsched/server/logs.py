"""Reading a job's log file in pieces: from a byte offset, or its last lines."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: Most bytes returned by one call; clients follow ``next_offset`` for more.
MAX_CHUNK = 1024 * 1024


def _complete_utf8(data: bytes) -> int:
    """Length of ``data`` without a trailing, not yet complete UTF-8 sequence."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0b1100_0000 == 0b1000_0000:
            continue  # a continuation byte: look further back for the lead byte
        if byte & 0b1000_0000 == 0:
            return len(data)  # ASCII: complete
        need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
        return len(data) if back >= need else len(data) - back
    return len(data)


def read_log(
    path: Path, offset: int | None = None, tail: int | None = None, max_bytes: int = MAX_CHUNK
) -> dict[str, Any]:
    """A piece of the log at ``path``.

    ``offset`` reads forward from that byte; ``tail`` returns the last ``tail`` lines
    (within the last ``max_bytes``); neither reads from the start. The answer has
    ``text``, ``offset`` (where the text starts), ``next_offset`` (where to continue)
    and ``size`` (the file's size now); a missing file reads as empty.
    """
    try:
        size = os.path.getsize(path)
    except PermissionError:
        raise  # another user's log in a shared pool: refused, not shown as empty
    except OSError:
        return {"text": "", "offset": 0, "next_offset": 0, "size": 0}
    if tail is not None:
        start = max(0, size - max_bytes)
    else:
        start = min(offset or 0, size)
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(min(max_bytes, size - start))
    end = start + _complete_utf8(data)
    data = data[: end - start]
    if tail is not None:
        lines = data.splitlines(keepends=True)
        if start > 0 and lines:
            lines = lines[1:]  # the first line is probably cut
        kept = lines[-tail:] if tail > 0 else []
        kept_bytes = b"".join(kept)
        start = end - len(kept_bytes)
        data = kept_bytes
    return {
        "text": data.decode("utf-8", errors="replace"),
        "offset": start,
        "next_offset": end,
        "size": size,
    }
