"""On-disk timing cache: SQLite (standard library), safe for several processes at once.

Unlike torchao's autoquant, which kept timings in a process-global dict (users pickled it by hand,
pytorch/ao#320, #854), a timing measured once is reused by every later run on the same machine
and software: the key is (device name, torch version, triton version, autoao version, candidate
spec, M, K, N, dtype, mode). Location: `cache_dir()/timings.sqlite`, where cache_dir() is
`$AUTOAO_CACHE_DIR` or `~/.cache/autoao`.

Concurrency: WAL journal + a 60 s busy timeout; every put is its own transaction, so two
processes writing at once both land. A file that is not a readable SQLite database is renamed
`timings.sqlite.corrupt-<time>` with a warning and a fresh cache starts: the cache is a cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from autoao.evaluators.timing import Timing

CACHE_FILE = "timings.sqlite"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS timings (
    key TEXT PRIMARY KEY,
    spec TEXT NOT NULL,       -- the TimingKey as JSON, for humans and reports
    median_us REAL, p20_us REAL, p80_us REAL, reps INTEGER,
    emulated TEXT, error TEXT,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL);
"""


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """The autoao cache directory: `override`, else $AUTOAO_CACHE_DIR, else ~/.cache/autoao."""
    if override is not None:
        return Path(override)
    env = os.environ.get("AUTOAO_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "autoao"


@dataclass(frozen=True)
class TimingKey:
    """Everything a timing depends on. `device` is the device's name (GPU model, or CPU model and
    thread count), not its index."""

    device: str
    torch: str
    triton: str
    autoao: str
    candidate: str  # Candidate.name, e.g. "int4_wo(group_size=64)"
    m: int  # tokens (rows of x)
    k: int  # in_features
    n: int  # out_features
    dtype: str  # activation dtype, e.g. "bfloat16"
    mode: str  # "eager", "graph" or "compile"

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()


class _SQLiteStore:
    """The cache file: opened (or set aside when corrupt and recreated), WAL, both tables."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path is not None else cache_dir() / CACHE_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = self._open()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)  # autocommit; explicit txns
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(_SCHEMA)
        conn.execute("SELECT COUNT(*) FROM timings").fetchone()
        return conn

    def _open(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.DatabaseError as e:  # "file is not a database", "malformed", ...
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            os.replace(self.path, aside)
            for suffix in ("-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            warnings.warn(f"timing cache {self.path} was unreadable ({e}); moved it to {aside} and "
                          "started a new one (timings will be measured again)", stacklevel=3)
            return self._connect()

    def close(self) -> None:
        self._conn.close()


class TimingCache(_SQLiteStore):
    """get/put Timings by TimingKey in an SQLite file (created on first use)."""

    def get(self, key: TimingKey) -> Timing | None:
        row = self._conn.execute(
            "SELECT median_us, p20_us, p80_us, reps, emulated, error FROM timings WHERE key = ?",
            (key.digest(),)).fetchone()
        if row is None:
            return None
        med, p20, p80, reps, emulated, error = row
        inf = float("inf")
        return Timing(inf if med is None else med, inf if p20 is None else p20, inf if p80 is None else p80,
                      reps, emulated, error)

    def put(self, key: TimingKey, t: Timing) -> None:
        def finite(v: float) -> float | None:  # SQLite has no inf literal through every driver
            return v if v != float("inf") else None

        self._conn.execute(
            "INSERT OR REPLACE INTO timings VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (key.digest(), json.dumps(asdict(key)), finite(t.median_us), finite(t.p20_us), finite(t.p80_us),
             t.reps, t.emulated, t.error, time.time()))

    def __len__(self) -> int:
        return self._conn.execute("SELECT COUNT(*) FROM timings").fetchone()[0]


class ResultCache(_SQLiteStore):
    """JSON results by string key (accuracy measurements of every tier), in the same SQLite file
    as the timings (table `results`), with the same concurrency and corruption handling."""

    def get(self, key: str) -> dict | None:
        row = self._conn.execute("SELECT value FROM results WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, key: str, value: dict) -> None:
        self._conn.execute("INSERT OR REPLACE INTO results VALUES (?, ?, ?)", (key, json.dumps(value), time.time()))


def digest(*parts: object) -> str:
    """sha256 over the parts: tensors by their bytes (and shape/dtype), everything else by repr."""
    import torch

    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, torch.Tensor):
            t = p.detach().contiguous().cpu()
            h.update(f"{tuple(t.shape)}{t.dtype}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            h.update(repr(p).encode())
    return h.hexdigest()
