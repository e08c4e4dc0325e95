"""Draft heads trained here: what they learn from and where they go.

The text a head learns from is the person's conversations and text found on
the machine (the installed packages' documentation and sources, or folders
the person names), each file placed in the chat template as a request and
its answer, and requests made from excerpts of those files that the target
answers itself (slower: it writes each reply, but those replies are what
it drafts through); the engine labels it all with the target
(engine/head_training.py).
A finished head is listed in the library like any model (kind "trained",
source ``trained:<target>``), so the model manager shows it under its target
and the pair picker offers it. The command line and the window share this.
"""

from __future__ import annotations

import codecs
import random
import re
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path

from specchat import records
from specchat.engine import folders
from specchat.engine.events import TRAINING_STATE, Message
from specchat.library import index, paths
from specchat.library.errors import LibraryError
from specchat.library.facts import read_folder

TEXT_SUFFIXES = (".md", ".rst", ".txt", ".py")
FILE_CHARS = 12_000  # at most this much of one file (a sample is a few thousand tokens)
SOURCE = "trained:"


def corpus_chats(corpus: Iterable[tuple[str, str, list[tuple[str, str]]]],
                 limit: int = 10_000) -> list[tuple[Message, ...]]:
    """The history's conversations (ConversationStore.corpus) as chats."""
    return [tuple(Message(role, content) for role, content in msgs) for _, _, msgs in corpus
            if msgs][:limit]


def _files(roots: list[Path]) -> Iterator[Path]:
    for root in roots:
        if root.is_file():
            yield root
            continue
        for path in sorted(root.rglob("*")):
            if path.suffix in TEXT_SUFFIXES and path.is_file() and not path.is_symlink():
                yield path


def _texts(paths: Iterable[Path]) -> Iterator[tuple[Path, str]]:
    """Each readable UTF-8 file's first FILE_CHARS, read as no more than
    their bytes (a character is at most 4): the whole file was read, and a
    3 GB ``.txt`` among the texts took 46 s and 6 GB of memory for its
    first 12,000 characters. Only regular files (records.open_file: a FIFO
    swapped in is never waited on); the rest are skipped."""
    for path in paths:
        try:
            with records.open_file(path) as f:
                data = f.read(4 * FILE_CHARS)
            # A character cut at the end is left out, not an error.
            text = codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
        except (OSError, UnicodeDecodeError, records.BadRecord):
            continue
        yield path, text[:FILE_CHARS]


def file_chats(roots: list[Path], max_chars: int) -> list[tuple[Message, ...]]:
    """Text files as chats: a request naming the file, its text the answer."""
    out, total = [], 0
    if max_chars <= 0:
        return out
    for path, text in _texts(_files(roots)):
        if len(text.strip()) < 200:
            continue
        kind = "Python module" if path.suffix == ".py" else "document"
        out.append((Message("user", f"Show me the {kind} {path.name}."),
                    Message("assistant", text)))
        total += len(text)
        if total >= max_chars:
            break
    return out


EXCERPT_CHARS = 700  # of a file, in a request: the target's reply should be most of a piece
ASKS = {  # what a request asks of an excerpt, by kind, in turn
    "code": ("Explain what this code does.", "Write tests for this code.",
             "How could this code be improved? Show the changed code.",
             "Add type hints and docstrings to this code."),
    "text": ("Summarize this in a few sentences.", "Explain this to a new user.",
             "Write an example that uses what this describes."),
}


def request_chats(roots: list[Path], count: int) -> list[tuple[Message, ...]]:
    """``count`` requests for the target to answer itself, each an excerpt
    of a text file with something asked of it (files drawn in a fixed
    shuffled order: many packages, not the first ones alphabetically)."""
    out: list[tuple[Message, ...]] = []
    if count <= 0:
        return out
    paths = list(_files(roots))
    random.Random(0).shuffle(paths)
    for path, text in _texts(paths):
        kind = "code" if path.suffix == ".py" else "text"
        if kind == "code":  # from the first definition: not a licence header or imports
            found = re.search(r"^(?:async def|def|class) ", text, re.MULTILINE)
            if found is None:
                continue
            text = text[found.start():]
        text = text.strip()
        if len(text) < 200:
            continue
        cut = text.rfind("\n", 0, EXCERPT_CHARS)
        excerpt = text[:cut if cut > EXCERPT_CHARS // 2 else EXCERPT_CHARS]
        ask = ASKS[kind][len(out) % len(ASKS[kind])]
        body = f"```python\n{excerpt}\n```" if kind == "code" else excerpt
        out.append((Message("user", f"{ask}\n\n{body}"),))
        if len(out) >= count:
            break
    return out


def default_texts() -> list[Path]:
    """The installed packages' documentation and sources."""
    return [Path(sysconfig.get_paths()["purelib"])]


def default_out(target: str) -> Path:
    """The head's folder in the library: a run there that was stopped goes on."""
    name = Path(target.rstrip("/")).name.split(":")[-1] or "target"
    return paths.models_dir(create=True) / f"{index.sanitize(name)}-eagle3-specchat"


def head_folder(out: str | Path, hint: str) -> Path:
    """``out`` (absolute) if a head may be trained into it: a new or empty
    folder, or one a head is being trained in (folders.training_folder, the
    rule the engine applies too); else LibraryError in words ending in
    ``hint``. Checked before a run reads or loads anything, so an installed
    model, a downloaded head or a folder of the person's is refused at once."""
    return folders.training_folder(out, hint, LibraryError)


def can_resume(out: Path) -> bool:
    return (out / TRAINING_STATE).is_file() and (out / "model.safetensors").is_file()


def list_trained(out: Path, target: str) -> index.InstalledModel:
    """List the head in ``out`` (again, after more training) for ``target``."""
    folder, source = out.resolve(), SOURCE + target
    facts = read_folder(folder)
    have = next((m for m in index.list_installed() if Path(m.path) == folder), None)
    if have is not None:  # trained further: the same entry, its facts anew
        return index.add(index.InstalledModel.create(have.name, source, "trained", folder, facts))
    return index.claim(index.sanitize(out.name), source, lambda name: (
        index.InstalledModel.create(name, source, "trained", folder, facts)))
