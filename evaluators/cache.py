"""On-disk timing cache: SQLite (standard library), safe for several processes at once.

Unlike torchao's autoquant, which kept timings in a process-global dict (users pickled it by hand,
pytorch/ao#320, #854), a timing measured once is reused by every later run on the same machine
and software: the key is (device name, torch version, triton version, autoao version, candidate
spec, M, K, N, dtype, mode, the kernel's launch options). Location: `cache_dir()/timings.sqlite`,
where cache_dir() is `$AUTOAO_CACHE_DIR` or `~/.cache/autoao`.

Concurrency: WAL journal + a 60 s busy timeout; every put is its own transaction, so two
processes writing at once both land. A file that is not a readable SQLite database is renamed
`timings.sqlite.corrupt-<time>` with a warning and a fresh cache starts: the cache is a cache.

Tensors (the unmodified model's side of the label-free judges: reference outputs and their
float32 noise) are not JSON: `TensorCache` keeps them as one safetensors file per key under
`references/` next to the SQLite file, written atomically; an unreadable file is a miss.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sqlite3
import time
import warnings
from dataclasses import asdict, dataclass
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from autoao.common import atomic_write, cache_dir  # noqa: F401  (cache_dir re-exported: the one cache root)
from autoao.kernels.algorithms import FIT_VERSION

if TYPE_CHECKING:
    import torch


CACHE_FILE = "timings.sqlite"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS timings (
    key TEXT PRIMARY KEY,
    spec TEXT NOT NULL,       -- the TimingKey as JSON, for humans and reports
    median_us REAL, p20_us REAL, p80_us REAL, reps INTEGER,
    emulated TEXT, error TEXT,
    created REAL NOT NULL,
    discarded INTEGER NOT NULL DEFAULT 0,  -- samples dropped: the process lost the CPU during them
    reliable INTEGER NOT NULL DEFAULT 1,   -- 0: too few clean samples; never reused as a clean timing
    single_us REAL,                        -- an unreliable multi-threaded cell's clean 1-thread time
    threads INTEGER NOT NULL DEFAULT 0,    -- the thread count of median_us (CPU; 0: not recorded)
    coarse INTEGER NOT NULL DEFAULT 0      -- 1: sampled at the coarse rate; a later run with time re-times it
);
CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL);
"""


@dataclass(frozen=True)
class Timing:
    """One measurement. Times in microseconds; `inf` when the candidate failed (see `error`)."""

    median_us: float
    p20_us: float
    p80_us: float
    reps: int
    emulated: str | None = None  # why this is only emulated on the device (never a speed-up)
    error: str | None = None  # why it failed (then the times are inf)
    kernel: str | None = None  # which of the module's CUDA kernels ran (None: it has only one)
    discarded: int = 0  # samples dropped because the process lost the CPU during them (CPU)
    # False: too few undisturbed samples, the times are the least-disturbed samples' (never cached
    # as a clean timing: re-measured by the next run)
    reliable: bool = True
    # An unreliable cell timed with several threads is timed again on one thread, which a busy
    # neighbour leaves alone (measured on a 2-core CPU with AMX next to two busy loops: a bf16 1536x576
    # layer at M=1 took 7.9 ms a call on 2 threads, 0.14 ms on 1 thread, 60 of 60 samples clean).
    # The cell's undisturbed time then lies in [single_us / threads, single_us].
    single_us: float | None = None
    threads: int = 0  # the thread count median_us was timed at (CPU; 0: not recorded)
    # True: sampled for less than a full cell's time (a deadline's first pass: every cell coarsely
    # before any is refined); reused when there is no time, re-timed by a run with time to spare
    coarse: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and math.isfinite(self.median_us)

    @property
    def bounded(self) -> bool:
        """True if this unreliable cell has a clean single-thread time to bound it."""
        return not self.reliable and self.single_us is not None and self.threads > 0

    @property
    def low_us(self) -> float:
        """The least the undisturbed cell can take: its median when reliable, the single-thread
        time over the thread count when bounded, else 0 (nothing is known)."""
        if self.reliable:
            return self.median_us
        return self.single_us / self.threads if self.bounded else 0.0

    @property
    def high_us(self) -> float:
        """The most the undisturbed cell can take: its median when reliable; else the least of the
        least-disturbed samples' median (a disturbed sample only runs long) and the single-thread time."""
        if self.reliable or not self.bounded:
            return self.median_us
        return min(self.median_us, self.single_us)

    @classmethod
    def failed(cls, error: str) -> Timing:
        return cls(math.inf, math.inf, math.inf, 0, None, error)

    def flagged(self, emulated: str | None) -> Timing:
        """This timing, marked as taken on an emulated path (or unchanged for None)."""
        return self if emulated is None else dataclasses.replace(self, emulated=emulated)

@dataclass(frozen=True)
class TimingKey:
    """Everything a timing depends on. `device` is the device's name (GPU model, or CPU model and
    thread count), not its index."""

    device: str
    torch: str
    triton: str
    autoao: str
    candidate: str  # Candidate.name, e.g. "int4_wo(group_size=64)", "@kernel" appended per CUDA kernel
    m: int  # tokens (rows of x)
    k: int  # in_features
    n: int  # out_features
    dtype: str  # activation dtype, e.g. "bfloat16"
    mode: str  # "eager", "graph" or "compile"
    # the kernel's launch options (KernelInfo.options), e.g. "pdl=1,prefetch_mb=8,early=1";
    # "" (no options) is left out of what is hashed, so those kernels' keys do not depend on this field
    options: str = ""

    def fields(self) -> dict[str, object]:
        """The key as a dict (what is hashed and stored), without `options` when it is empty."""
        d = asdict(self)
        if not d["options"]:
            del d["options"]
        return d

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.fields(), sort_keys=True).encode()).hexdigest()


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
        columns = {row[1] for row in conn.execute("PRAGMA table_info(timings)")}
        for column, decl in (("discarded", "INTEGER NOT NULL DEFAULT 0"), ("reliable", "INTEGER NOT NULL DEFAULT 1"),
                             ("single_us", "REAL"), ("threads", "INTEGER NOT NULL DEFAULT 0"),
                             ("coarse", "INTEGER NOT NULL DEFAULT 0")):
            if column not in columns:  # a cache file written before the column existed
                conn.execute(f"ALTER TABLE timings ADD COLUMN {column} {decl}")
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

    def get(self, key: TimingKey, *, unreliable: bool = False) -> Timing | None:
        """The cached timing, or None. An unreliable record (too few undisturbed samples) counts as
        missing, so it is measured again, unless `unreliable` asks for it."""
        row = self._conn.execute(
            "SELECT median_us, p20_us, p80_us, reps, emulated, error, discarded, reliable, single_us, threads, "
            "coarse FROM timings WHERE key = ?", (key.digest(),)).fetchone()
        if row is None or (not row[7] and not unreliable):
            return None
        med, p20, p80, reps, emulated, error, discarded, reliable, single_us, threads, coarse = row
        inf = float("inf")
        return Timing(inf if med is None else med, inf if p20 is None else p20, inf if p80 is None else p80,
                      reps, emulated, error, discarded=discarded, reliable=bool(reliable), single_us=single_us,
                      threads=threads, coarse=bool(coarse))

    def put(self, key: TimingKey, t: Timing) -> None:
        def finite(v: float) -> float | None:  # SQLite has no inf literal through every driver
            return v if v != float("inf") else None

        self._conn.execute(
            "INSERT OR REPLACE INTO timings (key, spec, median_us, p20_us, p80_us, reps, emulated, error, created, "
            "discarded, reliable, single_us, threads, coarse) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (key.digest(), json.dumps(key.fields()), finite(t.median_us), finite(t.p20_us), finite(t.p80_us),
             t.reps, t.emulated, t.error, time.time(), t.discarded, int(t.reliable), t.single_us, t.threads,
             int(t.coarse)))

    def __len__(self) -> int:
        return self._conn.execute("SELECT COUNT(*) FROM timings").fetchone()[0]

    def devices(self) -> list[CacheDevice]:
        """What the cache holds, per device name: cells, unreliable cells, failed cells, samples
        discarded, and when the newest was measured."""
        out: dict[str, list] = {}
        for spec, reliable, error, discarded, created in self._conn.execute(
                "SELECT spec, reliable, error, discarded, created FROM timings"):
            name = json.loads(spec).get("device", "?")
            row = out.setdefault(name, [0, 0, 0, 0, 0.0])
            row[0] += 1
            row[1] += not reliable
            row[2] += error is not None
            row[3] += discarded or 0
            row[4] = max(row[4], created)
        return [CacheDevice(name, *vals) for name, vals in sorted(out.items())]

    def clear_matching(self, fields: dict[str, str]) -> int:
        """Delete every cached timing whose key has these field values (e.g. one device, torch,
        triton, autoao and mode); returns how many."""
        return self._delete_where(lambda spec: all(spec.get(f) == v for f, v in fields.items()))

    def clear(self, device: str | None = None) -> int:
        """Delete every cached timing (or only those of the device whose name contains `device`);
        returns how many. Layer errors and accuracy results (the results table) are kept."""
        if device is None:
            return self._conn.execute("DELETE FROM timings").rowcount
        return self._delete_where(lambda spec: device.lower() in spec.get("device", "").lower())

    def _delete_where(self, matches: Callable[[dict], bool]) -> int:
        """Delete the timings whose stored key (as a dict) satisfies `matches`; returns how many."""
        keys = [k for (k, spec) in self._conn.execute("SELECT key, spec FROM timings") if matches(json.loads(spec))]
        self._conn.executemany("DELETE FROM timings WHERE key = ?", [(k,) for k in keys])
        return len(keys)


@dataclass(frozen=True)
class CacheDevice:
    name: str
    cells: int
    unreliable: int
    failed: int
    discarded_samples: int
    newest: float  # time.time() of the newest measurement


class ResultCache(_SQLiteStore):
    """JSON results by string key (accuracy measurements of every tier), in the same SQLite file
    as the timings (table `results`), with the same concurrency and corruption handling. Keys are
    stored under the calibrated fits' version (kernels.algorithms.FIT_VERSION): a result names its
    candidates, not the numbers their fits produced."""

    def _stored(self, key: str) -> str:
        return f"fit{FIT_VERSION}:{key}"

    def get(self, key: str) -> dict | None:
        row = self._conn.execute("SELECT value FROM results WHERE key = ?", (self._stored(key),)).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, key: str, value: dict) -> None:
        self._conn.execute("INSERT OR REPLACE INTO results VALUES (?, ?, ?)",
                           (self._stored(key), json.dumps(value), time.time()))


REFERENCES = "references"  # TensorCache's folder, next to the SQLite file


class TensorCache:
    """Named CPU tensors by string key, one safetensors file per key: `root`/<sha256 of scope and
    key>.safetensors. `scope` names what every key here depends on (the model's weights, the
    device, torch's version), so a key need only name the rest (the inputs, the parameters).
    Writes are atomic (autoao.common.atomic_write); a file that cannot be read is a miss and is
    removed, so the next put writes it afresh."""

    def __init__(self, root: str | os.PathLike, scope: str) -> None:
        self.root, self.scope = Path(root), scope

    def path(self, key: str) -> Path:
        return self.root / f"{digest(self.scope, key)}.safetensors"

    def has(self, key: str) -> bool:
        """Whether a file for `key` exists (it may still prove unreadable to `get`)."""
        return self.path(key).is_file()

    def get(self, key: str) -> dict[str, torch.Tensor] | None:
        """The tensors stored under `key` (on the CPU), or None: never stored, or unreadable."""
        from safetensors.torch import load_file  # lazy: only a run with a reference cache reads one

        path = self.path(key)
        if not path.is_file():
            return None
        try:
            return load_file(path)
        except Exception:  # noqa: BLE001 - truncated or not safetensors: the cache is a cache
            path.unlink(missing_ok=True)
            return None

    def put(self, key: str, tensors: Mapping[str, torch.Tensor]) -> None:
        """Store `tensors` under `key` (copied to the CPU), replacing what was there; a disk that
        refuses the write is warned about and the run goes on without the file."""
        from safetensors.torch import save  # lazy, as in get

        data = save({name: t.detach().cpu().contiguous() for name, t in tensors.items()}, {"key": key})
        try:
            atomic_write(self.path(key), lambda f: f.write(data))
        except OSError as e:
            warnings.warn(f"could not write the reference cache file {self.path(key)} ({e}): the unmodified "
                          "model's outputs will be computed again next run", stacklevel=2)


def numbered(name: str, tensors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """A list of tensors as TensorCache entries name.0, name.1, ... (`listed` reads them back)."""
    return {f"{name}.{i}": t for i, t in enumerate(tensors)}


def listed(stored: Mapping[str, torch.Tensor], name: str) -> list[torch.Tensor]:
    """The list `numbered(name, ...)` stored, in its order."""
    return [stored[f"{name}.{i}"] for i in range(sum(k.startswith(f"{name}.") for k in stored))]


def scalar(value: float) -> torch.Tensor:
    """A float as a 0-dim float64 TensorCache entry: float() of it is the same float."""
    import torch

    return torch.tensor(value, dtype=torch.float64)


def inputs_digest(inputs: Any) -> str:
    """`digest` of model inputs nested in lists, tuples and mappings (autoao's input convention):
    every tensor by its contents, with its place in the structure and the containers' kinds (a
    tuple is positional arguments, a mapping keyword arguments); other values by repr."""
    parts: list[object] = []

    def walk(x: Any, path: tuple) -> None:
        if isinstance(x, Mapping):
            parts.append((path, "mapping", sorted(map(str, x))))
            for k, v in x.items():
                walk(v, (*path, str(k)))
        elif isinstance(x, (list, tuple)):
            parts.append((path, type(x).__name__, len(x)))
            for i, v in enumerate(x):
                walk(v, (*path, i))
        else:
            parts.extend((path, x))

    walk(inputs, ())
    return digest(*parts)


def weights_key(model: Any) -> str:
    """The key of a model's weights (every state-dict tensor by content): the result caches and
    the judges' references are scoped to it, and a worker's model must match the coordinator's."""
    return digest("model", *model.state_dict().values())


def digest(*parts: object) -> str:
    """sha256 over the parts: host tensors by their bytes, tensors on an accelerator by
    `device_fingerprint` (both with shape and dtype), everything else by repr. A cache key: the
    same tensor on the host and on a GPU gets different keys (their results are measured apart)."""
    import torch

    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, torch.Tensor):
            t = p.detach()
            h.update(f"{tuple(t.shape)}{t.dtype}{'' if t.device.type == 'cpu' else t.device.type}".encode())
            if t.numel() and t.device.type == "cpu":
                h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy())  # buffer protocol: no copy
            elif t.numel():
                h.update(device_fingerprint(t))
        else:
            h.update(repr(p).encode())
    return h.hexdigest()


# Mixing constants (64-bit, as signed int64): the golden-ratio increment and splitmix64's multipliers.
_MIX = (0x9E3779B97F4A7C15 - 2**64, 0xBF58476D1CE4E5B9 - 2**64, 0x94D049BB133111EB - 2**64)
_FINGERPRINT_WORDS = 2**22  # 32-bit words per chunk: 32 MB per int64 temporary


def device_fingerprint(t) -> bytes:
    """16 bytes that identify the contents of tensor `t`, computed on t's device: two sums over
    its 32-bit words w_i (zero-padded) of w_i * m(i) mod 2**64, with odd multipliers m(i) drawn from
    a 64-bit mix of the word's index (one stream per sum). Changing any one word changes both sums
    (an odd multiplier is invertible mod 2**64); moving words changes their multipliers. Not a
    cryptographic hash: a cache key for weights that stay on a GPU, where sha256 would first copy
    them to the host (measured: ~20 s of a 290 s llama8 search on a datacenter GPU, 5.6 GB hashed twice:
    docs/measuring.md#where-a-searchs-time-goes)."""
    import torch

    b = t.detach().contiguous().reshape(-1).view(torch.uint8)
    b = torch.nn.functional.pad(b, (0, -b.numel() % 4))
    words = b.view(torch.int32)  # [W]
    sums = torch.zeros(2, dtype=torch.int64, device=t.device)
    for start in range(0, words.numel(), _FINGERPRINT_WORDS):
        w = words[start:start + _FINGERPRINT_WORDS].to(torch.int64)
        z = torch.arange(start, start + w.numel(), dtype=torch.int64, device=t.device) * _MIX[0]
        z = (z ^ (z >> 30)) * _MIX[1]  # int64 products wrap mod 2**64
        z = z ^ (z >> 27)
        sums[0] += (w * (z | 1)).sum()
        sums[1] += (w * ((z * _MIX[2]) | 1)).sum()
    return sums.cpu().numpy().tobytes()
