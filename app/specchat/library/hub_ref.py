"""A Hub reference (``hf:org/repo[@revision]``), read and checked.

A revision is sent to the Hub and becomes a file under the cache's
``refs/``, so it is held to git's own rules for a ref name. No network, no
huggingface_hub: the library's sources and the hub module both read
references through here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from specchat.library.errors import LibraryError

_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class HubRef:
    repo: str
    revision: str | None = None

    @property
    def ref(self) -> str:
        return f"hf:{self.repo}" + (f"@{self.revision}" if self.revision else "")

    @property
    def name(self) -> str:
        return self.repo.split("/", 1)[1]


def parse_ref(ref: str) -> HubRef:
    """``hf:org/repo[@revision]`` (the ``hf:`` prefix is optional here)."""
    body = ref[3:] if ref.startswith("hf:") else ref
    repo, _, revision = body.partition("@")
    repo = repo.strip().strip("/")
    if not _REPO.match(repo):
        raise LibraryError(
            f"{ref!r} is not a Hub reference: use hf:org/repo or hf:org/repo@revision, "
            "e.g. hf:mlx-community/Qwen2.5-0.5B-Instruct-4bit")
    revision = revision.strip()
    if revision and (why := _bad_revision(revision)):
        raise LibraryError(
            f"{ref!r}: {revision!r} is not a revision ({why}); use a branch or tag name "
            "(e.g. main, v1.0, refs/pr/1) or a 40-character commit id.")
    return HubRef(repo, revision or None)


# Characters a git ref name cannot contain (``git check-ref-format``) besides
# control characters.
_REF_FORBIDDEN = " ~^:?*[\\"


def _bad_revision(revision: str) -> str | None:
    """Why a revision cannot be a git branch, tag or commit id, or None.

    A revision is sent to the Hub and becomes a file under the cache's
    ``refs/``, so it must stay one name inside that folder. The rules are
    git's own (``git check-ref-format``), simple to state and to look up: no
    control characters, none of ``space ~ ^ : ? * [ \\``, no ``..`` or ``@{``,
    no leading ``/`` or ``-``, no empty part (``//``, trailing ``/``), no
    part starting with ``.`` or ending with ``.lock``, not ending with ``.``.
    """
    parts = revision.split("/")
    checks = [
        (any(ord(c) < 0x20 or ord(c) == 0x7F for c in revision), "it has a control character"),
        (any(c in _REF_FORBIDDEN for c in revision),
         f"it has {next((c for c in revision if c in _REF_FORBIDDEN), '')!r}"),
        (".." in revision, "it has '..'"),
        ("@{" in revision or revision == "@", "it has '@{'"),
        (revision.startswith(("/", "-")), f"it starts with {revision[:1]!r}"),
        ("" in parts, "it has an empty part ('//' or a '/' at the end)"),
        (any(p.startswith(".") for p in parts), "a part of it starts with '.'"),
        (any(p.endswith(".lock") for p in parts), "a part of it ends with '.lock'"),
        (revision.endswith("."), "it ends with '.'"),
    ]
    return next((why for bad, why in checks if bad), None)
