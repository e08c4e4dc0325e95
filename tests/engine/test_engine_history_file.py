"""The history index's saved file read back from disk (issue 29).

The file beside the history is a cache of token ids: whatever is in its
place, it is read only if it is a regular file of bounded size whose arrays
are stored (not compressed) and exactly as large as their headers say, and
one garbage record in it costs that conversation only. Anything else is
rebuilt from the conversations with a note that says why (the app logs it).
A FIFO, a device and a compression bomb are real files here, read in a
child process so that a hang or a blown memory budget fails the test.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from specchat.engine import history as history_mod
from specchat.engine.history import History

CONVS = [("1", "s1", "one"), ("2", "s2", "two"), ("3", "s3", "three")]


def _render(text: str) -> list[int]:
    return [len(text), 7, 8]


def _saved(tmp_path: Path) -> Path:
    path = tmp_path / "history.npz"
    History().sync("tok", CONVS, _render, path)
    return path


def _rewrite(path: Path, meta: dict, tokens: np.ndarray) -> None:
    """Write ``meta`` and ``tokens`` with a valid checksum: what another
    version or a tool writing garbage would leave."""
    blob = json.dumps(meta, sort_keys=True)
    np.savez(path, meta=np.array(blob), tokens=tokens,
             digest=np.array(history_mod.checksum(blob, tokens)))


def _contents(path: Path) -> tuple[dict, np.ndarray]:
    with np.load(path) as z:
        return json.loads(str(z["meta"])), np.asarray(z["tokens"])


@pytest.mark.parametrize("bad", [[5, "s2", 3], ["2", None, 3], ["2", "s2", 3, "extra"]])
def test_a_garbage_record_costs_only_its_conversation(tmp_path, bad):
    path = _saved(tmp_path)
    meta, tokens = _contents(path)
    assert meta["docs"][1] == ["2", "s2", 3]
    meta["docs"][1] = bad
    _rewrite(path, meta, tokens)
    history = History()
    rep = history.sync("tok", CONVS, _render, path)
    if len(bad) == 4:  # not a record of three fields: where the next one starts is unknown
        assert (rep.reused, rep.rendered) == (0, 3)
        assert rep.file_note.startswith("saved index damaged (record 2 is a list of 4, not "
                                        "[key, stamp, size]): rebuilt")
    else:
        assert (rep.reused, rep.rendered) == (2, 1)
        assert rep.file_note.startswith("reused saved index (2 conversations; 1 damaged "
                                        "record skipped)")
    assert [history.index.buf[slice(*history.span(k))].tolist() for k in "123"] == [
        [3, 7, 8], [3, 7, 8], [5, 7, 8]]


@pytest.mark.parametrize("size", ["3", -3, 4, 10**30])
def test_a_record_of_a_wrong_size_rebuilds_everything(tmp_path, size):
    path = _saved(tmp_path)
    meta, tokens = _contents(path)
    meta["docs"][1][2] = size
    _rewrite(path, meta, tokens)
    rep = History().sync("tok", CONVS, _render, path)
    assert (rep.reused, rep.rendered) == (0, 3)
    assert rep.file_note.startswith("saved index damaged (sizes): rebuilt")


@pytest.mark.parametrize("meta", [[1, 2], {"format": 1, "fingerprint": "tok", "docs": 7}])
def test_meta_that_is_not_a_record_rebuilds_everything(tmp_path, meta):
    path = _saved(tmp_path)
    _rewrite(path, meta, _contents(path)[1])
    rep = History().sync("tok", CONVS, _render, path)
    assert (rep.reused, rep.rendered) == (0, 3)
    assert rep.file_note.startswith("saved index damaged (its table of conversations is not "
                                    "one): rebuilt")


CHILD = """
import json, resource, sys, time
from pathlib import Path
from specchat.engine.history import History

def render(text):
    return [len(text), 7, 8]

before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.monotonic()
rep = History().sync("tok", [("1", "s1", "one"), ("2", "s2", "two")], render, Path(sys.argv[1]))
print(json.dumps({"note": rep.file_note, "rendered": rep.rendered,
                  "seconds": time.monotonic() - start,
                  "grew_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}))
"""


def _sync_in_a_child(path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["fifo", "link to a fifo", "link to a device", "folder"])
def test_what_is_not_a_regular_file_is_never_opened(tmp_path, kind):
    """A FIFO in the history file's place blocked the sync (the engine
    thread) forever; /dev/zero would be read without end."""
    path = tmp_path / "history.npz"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link to a fifo":
        os.mkfifo(tmp_path / "pipe")
        path.symlink_to(tmp_path / "pipe")
    elif kind == "link to a device":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    out = _sync_in_a_child(path)
    what = {"fifo": "a FIFO (named pipe)", "link to a fifo": "a FIFO (named pipe)",
            "link to a device": "a character device", "folder": "a folder"}[kind]
    assert out["rendered"] == 2
    assert out["note"].startswith(f"saved index refused (it is {what}, not a regular file): "
                                  "rebuilt"), out


def _npy_header(dtype: str, shape: tuple) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue()


def _bomb(path: Path, gib: int = 1) -> None:
    """A zip whose tokens.npy inflates to ``gib`` GiB of zeros from about a
    megabyte (deflate compresses zeros a thousandfold)."""
    meta = json.dumps({"format": 1, "fingerprint": "tok", "docs": [["1", "s1", 2**28 * gib]]})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, arr in (("meta.npy", np.array(meta)), ("digest.npy", np.array("0" * 64))):
            buf = io.BytesIO()
            np.save(buf, arr)
            z.writestr(name, buf.getvalue(), compress_type=zipfile.ZIP_STORED)
        with z.open("tokens.npy", "w", force_zip64=True) as f:
            f.write(_npy_header("<i4", (2**28 * gib,)))
            chunk = bytes(2**24)
            for _ in range(64 * gib):
                f.write(chunk)


def test_a_compression_bomb_is_refused_without_inflating_it(tmp_path):
    path = tmp_path / "history.npz"
    _bomb(path)
    assert path.stat().st_size < 8 * 2**20
    out = _sync_in_a_child(path)
    assert out["rendered"] == 2
    assert out["note"].startswith("saved index refused (tokens.npy is compressed; SpecChat "
                                  "stores its arrays as they are): rebuilt"), out
    assert out["grew_mb"] < 100 and out["seconds"] < 10, out


def test_an_array_larger_than_its_bytes_is_refused_before_it_is_allocated(tmp_path):
    """A stored meta.npy whose header claims a 1 GiB string (numpy allocates
    what the header says, then reads): refused by the header."""
    path = tmp_path / "history.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("meta.npy", _npy_header("<U268435456", ()) + b"{}")
        for name, arr in (("tokens.npy", np.zeros(3, np.int32)),
                          ("digest.npy", np.array("0" * 64))):
            buf = io.BytesIO()
            np.save(buf, arr)
            z.writestr(name, buf.getvalue())
    out = _sync_in_a_child(path)
    assert out["note"].startswith("saved index refused (meta.npy holds 2 bytes of data where "
                                  "its header says 1073741824): rebuilt"), out
    assert out["grew_mb"] < 100, out


def test_a_file_over_the_bound_is_not_read(tmp_path):
    path = tmp_path / "history.npz"
    with open(path, "wb") as f:
        f.truncate(513 * 2**20)  # sparse: the bound is 512 MB
    out = _sync_in_a_child(path)
    assert out["note"].startswith("saved index refused (it is 513.0 MB, larger than the "
                                  "512.0 MB such a file can be): rebuilt"), out
    assert out["grew_mb"] < 100, out


def test_other_members_or_a_gzip_file_are_refused(tmp_path):
    path = _saved(tmp_path)
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("extra.npy", b"")
    rep = History().sync("tok", CONVS, _render, path)
    assert rep.rendered == 3 and rep.file_note.startswith(
        "saved index refused (it holds digest.npy, extra.npy, meta.npy, tokens.npy, not "
        "digest.npy, meta.npy, tokens.npy): rebuilt")
    import gzip

    path.write_bytes(gzip.compress(bytes(2**20)))
    rep = History().sync("tok", CONVS, _render, path)
    assert rep.rendered == 3 and rep.file_note.startswith(
        "saved index refused (it is not a zip file): rebuilt")


def test_ids_outside_the_vocabulary_never_enter_the_index(engine, tmp_path):
    """A saved file of the right tokenizer, validly signed, whose ids for one
    conversation lie outside the model's vocabulary (or are negative, the
    separator's value): drafting would feed them to the target's embedding.
    That conversation is rendered again, the others reused."""
    from specchat.engine.events import Message

    convs = [(k, f"s{k}", (Message("user", f"Question number {k}?"),)) for k in "123"]
    engine.sync_history(convs, tmp_path)
    path = next(tmp_path.glob("history-*.npz"))
    meta, tokens = _contents(path)
    sizes = [size for _key, _stamp, size in meta["docs"]]
    forged = tokens.copy()
    forged[sizes[0]] = 10**6  # in conversation 2
    forged[sizes[0] + sizes[1] + 1] = -1  # in conversation 3
    _rewrite(path, meta, forged)
    rep = engine.sync_history(convs, tmp_path)
    assert (rep.reused, rep.rendered) == (1, 2)
    assert rep.file_note.startswith("reused saved index (1 conversations; 2 damaged records "
                                    "skipped)")
    held = np.concatenate([engine.history.index.buf[slice(*engine.history.span(k))]
                           for k in "123"])
    assert held.min() >= 0 and held.max() < engine.vocab
    assert held.tolist() == tokens.tolist()
