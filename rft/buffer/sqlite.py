"""SQLite for the buffer: the trainer's archive of consumed experiences, and the ``sql`` transport.

Both are named by ``buffer.trainer_input.experience_buffer.path: sqlite:///<file>.db``.
:class:`SqliteArchive` (``storage_type: queue``) is written by the trainer alone: one row per
experience it consumed, with the step. :class:`SqlBufferWriter` / :class:`SqlBufferReader`
(``storage_type: sql``) carry experiences from explorers to the trainer on one node only
(:func:`check_sql_transport`). Rows hold :func:`rft.buffer.experience.encode_line` text.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from rft.buffer.experience import (
    Experience,
    ReaderStats,
    StalenessFilter,
    check_group_fits,
    contiguous_groups,
    decode_line,
    encode_line,
    poll_read,
)
from rft.errors import ConfigError, DataError

log = logging.getLogger(__name__)

SQL_FORMAT = 1  # format of the tables below; a newer one is refused with "upgrade"
_TABLE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_NODE_VARS = ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")


def sqlite_url_path(run_dir: Path | str, url: str) -> Path:
    """``sqlite:///x.db`` -> ``<run_dir>/x.db``; ``sqlite:////abs/x.db`` -> ``/abs/x.db``."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise ConfigError(
            f"buffer.trainer_input.experience_buffer.path: {url!r} is not sqlite:///<file>.db "
            "(relative to the run directory) or sqlite:////<absolute path>.db"
        )
    path = Path(url[len(prefix) :])
    return path if path.is_absolute() else Path(run_dir) / path


def slurm_num_nodes() -> int:
    """Nodes of this SLURM job from the environment (all het groups summed); 1 outside SLURM."""
    groups = [
        v
        for k, v in os.environ.items()
        if re.match(r"SLURM_JOB_NUM_NODES_(HET|PACK)_GROUP_\d+$", k)
    ]
    if groups:
        return sum(int(v) for v in groups if v.isdigit())
    for var in _NODE_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 1


def check_sql_transport(num_nodes: int | None = None) -> None:
    """Refuse ``storage_type: sql`` when the run spans several nodes (given or from SLURM):
    SQLite's locking is unreliable on network filesystems."""
    nodes = max(num_nodes or 1, slurm_num_nodes())
    if nodes > 1:
        raise ConfigError(
            f"buffer.trainer_input.experience_buffer.storage_type: sql needs every explorer and "
            f"the trainer on one node, but this run has {nodes} nodes: SQLite locking is "
            "unreliable on network filesystems (NFS, Lustre; WAL does not work there). Use "
            "storage_type: queue (sealed JSONL segments; a sqlite:/// path then keeps an archive)"
        )


def _check_table(table: str) -> str:
    if not _TABLE_RE.match(table):
        raise ConfigError(
            f"buffer.trainer_input.experience_buffer.name: {table!r} must be letters, digits, "
            "'_' or '-' (it names the SQLite table)"
        )
    return table


def connect(db_path: Path) -> sqlite3.Connection:
    """Open (creating) a database in autocommit mode; DataError naming the file if impossible."""
    try:
        db_path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(db_path, timeout=60.0, isolation_level=None)
        conn.execute("PRAGMA synchronous=FULL")
        _check_format(conn, db_path)
    except (sqlite3.Error, OSError) as e:
        raise DataError(
            f"cannot open SQLite database {db_path}: {e}; check the path and its "
            "permissions (it must be a SQLite file or not exist)"
        ) from e
    return conn


def _check_format(conn: sqlite3.Connection, db_path: Path) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS rft_meta (key TEXT PRIMARY KEY, value TEXT)")
        conn.execute("INSERT OR IGNORE INTO rft_meta VALUES ('format', ?)", (str(SQL_FORMAT),))
        (version,) = conn.execute("SELECT value FROM rft_meta WHERE key='format'").fetchone()
    finally:
        conn.execute("COMMIT")
    if int(version) > SQL_FORMAT:
        raise DataError(
            f"{db_path} has rft table format {version}, written by a newer rft "
            f"(this one reads format {SQL_FORMAT}); upgrade rft"
        )


class SqliteArchive:
    """The trainer's record of every consumed experience (single writer, queryable later)."""

    def __init__(self, db_path: Path | str, table: str = "experience_buffer"):
        self.db_path = Path(db_path)
        self.table = _check_table(table)
        self._conn = connect(self.db_path)
        self._conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{self.table}" (experience_id TEXT PRIMARY KEY, '
            "step INTEGER, consumed_time REAL, writer TEXT, task_id TEXT, group_id TEXT, "
            "model_version INTEGER, reward REAL, source TEXT, eval INTEGER, truncated INTEGER, "
            "response_len INTEGER, data TEXT NOT NULL)"
        )

    def record(self, experiences: Iterable[Experience], step: int) -> int:
        """Store experiences consumed at ``step`` in one transaction; return the row count."""
        now = time.time()
        rows = [
            (
                e.experience_id,
                step,
                now,
                e.writer,
                e.task_id,
                e.group_id,
                e.model_version,
                float(e.reward),
                e.source,
                int(e.eval),
                int(e.truncated),
                e.array_len("response_ids"),
                encode_line(e),
            )
            for e in experiences
        ]
        with self._conn:  # BEGIN ... COMMIT
            self._conn.execute("BEGIN")
            self._conn.executemany(
                f'INSERT OR REPLACE INTO "{self.table}" VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)', rows
            )
        return len(rows)

    def count(self) -> int:
        return self._conn.execute(f'SELECT COUNT(*) FROM "{self.table}"').fetchone()[0]

    def experiences(self, step: int | None = None) -> list[Experience]:
        """Archived experiences (of one step if given), in consumption order."""
        query = f'SELECT data FROM "{self.table}"'
        args: tuple[int, ...] = ()
        if step is not None:
            query, args = query + " WHERE step = ?", (step,)
        return [decode_line(d) for (d,) in self._conn.execute(query + " ORDER BY rowid", args)]

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "SqliteArchive":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _create_transport_table(conn: sqlite3.Connection, table: str) -> None:
    conn.execute(
        f'CREATE TABLE IF NOT EXISTS "{table}" (id INTEGER PRIMARY KEY AUTOINCREMENT, '
        "writer TEXT, group_id TEXT, model_version INTEGER, data TEXT NOT NULL)"
    )


class SqlBufferWriter:
    """One explorer task's writer for ``storage_type: sql`` (single node only)."""

    def __init__(self, db_path: Path | str, writer: str, table: str = "experience_buffer"):
        self.db_path, self.writer, self.table = Path(db_path), writer, _check_table(table)
        self._conn = connect(self.db_path)
        _create_transport_table(self._conn, self.table)

    def write(self, experiences: Sequence[Experience], seq: int | None = None) -> int:
        """Insert a batch (whole groups) in one transaction, so a group's rows have consecutive
        rowids (the reader's cursor); ``seq`` is accepted and unused."""
        rows = []
        for e in contiguous_groups(experiences):  # encode_line validates
            rows.append((self.writer, e.group_id, e.model_version, encode_line(e, self.writer)))
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.executemany(
                f'INSERT INTO "{self.table}" (writer, group_id, model_version, data) '
                "VALUES (?,?,?,?)",
                rows,
            )
        return len(rows)

    def close(self) -> None:
        self._conn.close()


class SqlBufferReader:
    """The trainer's reader for ``storage_type: sql``: whole groups, cursor on rowid."""

    def __init__(
        self,
        db_path: Path | str,
        table: str = "experience_buffer",
        cursor: dict[str, Any] | None = None,
        max_staleness_versions: int | None = None,
        drop_stale: bool = True,
    ):
        self.db_path, self.table = Path(db_path), _check_table(table)
        self._conn = connect(self.db_path)
        _create_transport_table(self._conn, self.table)
        self.stats = ReaderStats()
        self._staleness = StalenessFilter(max_staleness_versions, drop_stale)
        self._rowid = _parse_sql_cursor(cursor)
        self._corrupt_counted_to = self._rowid  # rows re-fetched after a full read count once

    def cursor(self) -> dict[str, Any]:
        return {"sql_rowid": self._rowid}

    def read(
        self,
        max_experiences: int | None = None,
        current_version: int | None = None,
        timeout_s: float = 0.0,
        poll_s: float = 0.5,
    ) -> list[Experience]:
        """Up to ``max_experiences`` records in whole groups (see SegmentReader.read)."""
        return poll_read(
            lambda budget, first: self._read_once(budget, current_version, first),
            max_experiences,
            timeout_s,
            poll_s,
        )

    def release(self, cursor: dict[str, Any]) -> int:
        """Delete rows consumed according to ``cursor`` (one saved in a checkpoint)."""
        upto = min(_parse_sql_cursor(cursor), self._rowid)
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            deleted = self._conn.execute(f'DELETE FROM "{self.table}" WHERE id <= ?', (upto,))
        return deleted.rowcount

    def close(self) -> None:
        self._conn.close()

    def _read_once(
        self, budget: int | None, current_version: int | None, first: bool
    ) -> tuple[list[Experience], bool, bool]:
        limit = -1 if budget is None else budget + 1  # one extra row shows whether a group is cut
        rows = self._conn.execute(
            f'SELECT id, data FROM "{self.table}" WHERE id > ? ORDER BY id LIMIT ?',
            (self._rowid, limit),
        ).fetchall()
        full = budget is not None and len(rows) > budget
        groups = self._groups(rows)
        next_rowid = rows[-1][0] if rows else self._rowid  # also past corrupt rows at the end
        if full and groups:
            cut, first_id, _ = groups.pop()  # its rows may continue beyond the extra row
            if first and not groups:
                check_group_fits(cut, budget or 0)
            next_rowid = first_id - 1
        out: list[Experience] = []
        for group, _first, _last in groups:
            if self._staleness.keep(group, current_version, self.stats):
                out.extend(group)
                self.stats.groups_read += 1
        self._rowid = next_rowid
        self.stats.segments_read += 1 if rows else 0
        self.stats.experiences_read += len(out)
        return out, full, bool(rows)

    def _groups(self, rows: list[tuple[int, str]]) -> list[tuple[list[Experience], int, int]]:
        """Valid records grouped by consecutive group_id, each with its first and last id."""
        groups: list[tuple[list[Experience], int, int]] = []
        for rowid, data in rows:
            try:
                exp = decode_line(data)
            except DataError as e:
                if rowid > self._corrupt_counted_to:
                    self.stats.corrupt_records += 1
                    self._corrupt_counted_to = rowid
                    log.warning(
                        "skipped corrupt record %s table %s id %d: %s",
                        self.db_path,
                        self.table,
                        rowid,
                        e,
                    )
                continue
            if groups and groups[-1][0][0].group_id == exp.group_id:
                groups[-1][0].append(exp)
                groups[-1] = (groups[-1][0], groups[-1][1], rowid)
            else:
                groups.append(([exp], rowid, rowid))
        return groups


def _parse_sql_cursor(cursor: dict[str, Any] | None) -> int:
    if not cursor:
        return 0
    if "sql_rowid" not in cursor:
        raise DataError(
            f"buffer cursor {str(cursor)[:80]} is not an sql-buffer cursor (was the checkpoint "
            "written with another buffer storage_type?); resume with the same storage_type"
        )
    return int(cursor["sql_rowid"])
