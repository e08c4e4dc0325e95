"""The user's past conversations as one suffix index, for drafting.

People ask for code and then for a change to it, tests for it, the same
kind of answer again tomorrow. What a reply copies from earlier
conversations costs nothing to draft, so every conversation in the store
(rendered with the target's chat template, the very ids the model saw) is
kept in one SuffixIndex, and each finished reply joins it as it ends.

The index is tied to a tokenizer (by fingerprint): ids of one tokenizer mean
nothing to another. It is rebuilt from the store's conversations when a pair
loads, reusing the token ids saved beside the store for conversations whose
stamp has not changed. That file is read as a cache, never trusted: a bad
checksum, another tokenizer or another format version means everything is
rendered again. It is opened only if it is a regular file (a FIFO in its
place would block the engine thread forever) of at most ``MAX_FILE_BYTES``,
and its arrays are read only if they are stored, not compressed (a
compression bomb is never inflated), and exactly as large as their headers
say (numpy allocates what a header claims before reading). One garbage
record costs its own conversation only. Conversation keys and stamps are
the caller's (the store's ids and last-change marks); the engine knows
nothing of the store.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specchat import records
from specchat.engine.suffix_index import SuffixIndex

FORMAT = 1
# 4 bytes a token: some 130 million tokens of conversations. A bigger file is
# not read (the history is rendered again).
MAX_FILE_BYTES = 512 * 2**20
_MEMBERS = ("digest.npy", "meta.npy", "tokens.npy")  # what save() writes
# Removed conversations leave dead positions; rebuild when they pass this share.
COMPACT_DEAD = 0.3


@dataclass
class _Doc:
    stamp: str
    start: int
    end: int


@dataclass(frozen=True)
class SyncReport:
    conversations: int
    reused: int  # token ids taken from the saved file
    rendered: int  # rendered and tokenized again
    failed: int  # could not be rendered (skipped)
    tokens: int
    bytes: int
    seconds: float
    file_note: str  # what happened to the saved file, for the log


class History:
    """Conversations by key, in one index. Owned by the engine thread."""

    def __init__(self) -> None:
        self.index = SuffixIndex()
        self.docs: dict[str, _Doc] = {}
        self.fingerprint: str | None = None
        self.path: Path | None = None
        self.enabled = True  # False: drafts ignore the history (the bench's cold runs)

    # -- what the drafter reads ---------------------------------------------
    def span(self, key: str | None) -> tuple[int, int] | None:
        doc = self.docs.get(key) if key else None
        return (doc.start, doc.end) if doc else None

    @property
    def tokens(self) -> int:
        return sum(d.end - d.start for d in self.docs.values())

    # -- changing it -------------------------------------------------------
    def clear(self) -> None:
        self.index = SuffixIndex()
        self.docs = {}

    def put(self, key: str, tokens: Sequence[int], stamp: str = "") -> None:
        """The conversation ``key`` now reads ``tokens``. A conversation that
        only grew (the usual case: a new turn) and is the latest one is
        extended in place; otherwise its old text is removed and the new one
        appended."""
        doc = self.docs.get(key)
        idx = self.index
        if doc is not None and doc.end == idx.n and len(tokens) >= doc.end - doc.start and \
                np.array_equal(idx.buf[doc.start:doc.end],
                               np.asarray(tokens[:doc.end - doc.start], dtype=np.int32)):
            idx.extend(tokens[doc.end - doc.start:])
            doc.end, doc.stamp = idx.n, stamp
            return
        if doc is not None:
            self.remove(key)
            idx = self.index  # the removal may have compacted into a new index
        start = idx.new_document()
        idx.extend(tokens)
        self.docs[key] = _Doc(stamp, start, idx.n)

    def remove(self, key: str) -> None:
        doc = self.docs.pop(key, None)
        if doc is None:
            return
        self.index.remove(doc.start, doc.end)
        if self.index.dead_count > COMPACT_DEAD * max(1, self.index.tokens):
            self._rebuild({k: self._ids(d) for k, d in self.docs.items()},
                          {k: d.stamp for k, d in self.docs.items()})

    def _ids(self, doc: _Doc) -> np.ndarray:
        return self.index.buf[doc.start:doc.end].copy()

    def _rebuild(self, ids: dict[str, np.ndarray], stamps: dict[str, str]) -> None:
        """One sort over everything (bulk loading, compaction)."""
        index = SuffixIndex(tail=1 << 62)  # no sealing while loading
        docs = {}
        for key, toks in ids.items():
            start = index.new_document()
            index.extend(toks)
            docs[key] = _Doc(stamps.get(key, ""), start, index.n)
        index.compact()
        index.tail_max = SuffixIndex().tail_max
        self.index, self.docs = index, docs

    # -- loading from the store ---------------------------------------------
    def sync(self, fingerprint: str, conversations: Iterable[tuple[str, str, object]],
             render: Callable[[object], list[int]], path: Path | None,
             vocab: int | None = None) -> SyncReport:
        """Rebuild from the store's conversations: (key, stamp, messages).
        Ids saved in ``path`` are reused for unchanged stamps (and only if
        they are below ``vocab``, the model's vocabulary, when given); the
        rest are rendered with ``render``. The file is then rewritten."""
        t0 = time.perf_counter()
        saved, note = _read(path, fingerprint, vocab) if path is not None else ({}, "no file")
        ids: dict[str, np.ndarray] = {}
        stamps: dict[str, str] = {}
        reused = rendered = failed = 0
        total = 0
        for key, stamp, messages in conversations:
            got = saved.get(key)
            if got is not None and got[0] == stamp and stamp:
                ids[key] = got[1]
                reused += 1
            else:
                try:
                    ids[key] = np.asarray(render(messages), dtype=np.int32)
                except Exception:  # a conversation the template cannot render: skip it
                    failed += 1
                    continue
                rendered += 1
            stamps[key] = stamp
            total += 1
        self.fingerprint, self.path = fingerprint, path
        self._rebuild(ids, stamps)
        if path is not None:
            note += "; " + self.save()
        return SyncReport(total, reused, rendered, failed, self.tokens, self.index.nbytes,
                          time.perf_counter() - t0, note)

    def save(self) -> str:
        """Write the ids beside the store (atomically); says what happened."""
        if self.path is None or self.fingerprint is None:
            return "not saved"
        keys = sorted(self.docs)
        arrays = {k: self._ids(self.docs[k]) for k in keys}
        meta = {"format": FORMAT, "fingerprint": self.fingerprint,
                "docs": [[k, self.docs[k].stamp, int(arrays[k].size)] for k in keys]}
        tokens = np.concatenate([arrays[k] for k in keys]) if keys else np.zeros(0, np.int32)
        blob = json.dumps(meta, sort_keys=True)
        digest = checksum(blob, tokens)
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".history-", suffix=".npz")
            with os.fdopen(fd, "wb") as f:
                np.savez(f, meta=np.array(blob), tokens=tokens, digest=np.array(digest))
            os.replace(tmp, self.path)
        except OSError as e:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            return f"could not save the history index: {e}"
        return f"saved {len(keys)} conversations"


def checksum(meta: str, tokens: np.ndarray) -> str:
    """What a saved file's ``digest`` holds: any change to its meta or ids
    shows. Public: whatever writes the format signs it with this (a test
    forging a validly signed file of garbage, or of another version)."""
    h = hashlib.sha256(meta.encode())
    h.update(np.ascontiguousarray(tokens, dtype=np.int32).tobytes())
    return h.hexdigest()


def _read(path: Path, fingerprint: str, vocab: int | None = None
          ) -> tuple[dict[str, tuple[str, np.ndarray]], str]:
    """The saved ids by key, or nothing (and why) when the file is missing,
    not a regular file, too big, damaged, of another format or of another
    tokenizer. A record whose key or stamp is garbage, or whose ids are
    negative (the separator's value) or not below ``vocab``, is left out alone."""
    try:
        return _docs(_arrays(records.read_file(path, MAX_FILE_BYTES)), fingerprint, vocab)
    except FileNotFoundError:
        return {}, "no saved index"
    except (OSError, records.BadRecord) as e:  # reading it, or what it holds
        return {}, f"saved index refused ({e}): rebuilt"
    except Exception as e:  # any other damage at all: the file is a cache
        return {}, f"saved index unreadable ({type(e).__name__}): rebuilt"


def _arrays(blob: bytes) -> dict[str, np.ndarray]:
    """The arrays ``save`` wrote, from the file's bytes: only its three
    members, each stored (so it is no larger than the file) and each as
    large as its header says."""
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            infos = z.infolist()
            names = sorted(i.filename for i in infos)
            if names != list(_MEMBERS):
                raise records.BadRecord(f"it holds {', '.join(names)}, not {', '.join(_MEMBERS)}")
            out = {}
            for info in infos:
                if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
                    raise records.BadRecord(f"{info.filename} is compressed; SpecChat stores its "
                                            "arrays as they are")
                out[info.filename[:-4]] = _npy(info.filename, z.read(info))
            return out
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as e:
        raise records.BadRecord("it is not a zip file" if str(e) == "File is not a zip file"
                                else f"its zip structure is damaged ({e})") from None


def _npy(name: str, data: bytes) -> np.ndarray:
    """One .npy member, refused unless its header's shape and type account
    for exactly the bytes after it (nothing is allocated beyond them)."""
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read_header(f)
    except ValueError as e:
        raise records.BadRecord(f"{name} is not an array ({e})") from None
    count = math.prod(shape)
    have = len(data) - f.tell()
    if dtype.hasobject or count * dtype.itemsize != have:
        raise records.BadRecord(f"{name} holds {have} bytes of data where its header says "
                                f"{count * dtype.itemsize}")
    return np.frombuffer(data, dtype=dtype, count=count, offset=f.tell()).reshape(
        shape, order="F" if fortran else "C")


def _docs(arrays: dict[str, np.ndarray], fingerprint: str, vocab: int | None
          ) -> tuple[dict[str, tuple[str, np.ndarray]], str]:
    meta_array, tokens, digest_array = arrays["meta"], arrays["tokens"], arrays["digest"]
    if meta_array.dtype.kind != "U" or digest_array.dtype.kind != "U" or tokens.ndim != 1 \
            or tokens.dtype.kind not in "iu":
        return {}, "saved index damaged (arrays of other kinds): rebuilt"
    blob, digest = str(meta_array), str(digest_array)
    tokens = np.asarray(tokens, dtype=np.int32)
    if digest != checksum(blob, tokens):
        return {}, "saved index damaged (checksum): rebuilt"
    meta = records.parse_json(blob)
    if not isinstance(meta, dict) or not isinstance(meta.get("docs"), list):
        return {}, "saved index damaged (its table of conversations is not one): rebuilt"
    if meta.get("format") != FORMAT:
        return {}, "saved index of another version: rebuilt"
    if meta.get("fingerprint") != fingerprint:
        return {}, "saved index of another tokenizer: rebuilt"
    out, at, skipped = {}, 0, 0
    for n, doc in enumerate(meta["docs"], start=1):
        if not isinstance(doc, list) or len(doc) != 3:
            return {}, (f"saved index damaged (record {n} is {records.described(doc)}, not "
                        "[key, stamp, size]): rebuilt")
        key, stamp, size = doc
        if not records.conforms(size, int) or not 0 <= size <= tokens.size - at:
            return {}, "saved index damaged (sizes): rebuilt"
        ids = tokens[at:at + size]
        if isinstance(key, str) and isinstance(stamp, str) and _in_vocab(ids, vocab):
            out[key] = (stamp, ids)
        else:
            skipped += 1  # its conversation is rendered again
        at += size
    if at != tokens.size:
        return {}, "saved index damaged (sizes): rebuilt"
    damaged = f"; {skipped} damaged record{'s' if skipped != 1 else ''} skipped" if skipped else ""
    return out, f"reused saved index ({len(out)} conversations{damaged})"


def _in_vocab(ids: np.ndarray, vocab: int | None) -> bool:
    """Ids a drafter may propose: a forged one beyond the vocabulary would
    reach the target's embedding, a negative one would match as the separator."""
    return not ids.size or (int(ids.min()) >= 0 and (vocab is None or int(ids.max()) < vocab))
