"""Both ends of a control connection prove they hold the cluster's secret
(secret.py) before a rank acts on anything: challenge and response with
HMAC-SHA256, a fresh nonce from each side.

    rank 0 -> rank   {"hello": {"nonce": Nc}}
    rank -> rank 0   {"challenge": {"nonce": Nr, "rank": r,
                                    "proof": HMAC(K, "rank", Nc, Nr, r)}}
    rank 0 -> rank   {"probe" | "join": {...},
                      "proof": HMAC(K, "rank 0", Nr, Nc, kind, the request)}
    rank -> rank 0   {"ready" | "joined" | "error": {...}}

Rank 0 checks the rank's proof first (so "ready" means a rank of this
cluster, and a process without the secret learns nothing from rank 0's),
then the rank checks rank 0's, which covers the request itself: a request
recorded on the wire and replayed fails, because the rank's nonce is new
on every connection, and a changed request fails because its proof no
longer matches. The two proofs name different roles, so neither can stand
in for the other. Imports no MLX.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time

from specchat.engine.distributed import wire
from specchat.engine.distributed.wire import Line, Message, ProtocolError

RANK = b"specchat cluster: rank"
RANK_0 = b"specchat cluster: rank 0"
ANSWERS = ("ready", "joined", "error")


class NotOurs(ProtocolError):
    """The other end is a SpecChat rank, but not of this cluster (or not
    this rank): it proved another secret, or another rank number."""


def proof(secret: bytes, role: bytes, *parts: str) -> str:
    """HMAC-SHA256 of ``role`` and ``parts``, each length-prefixed (so no
    two different lists of parts give the same bytes)."""
    data = b"".join(len(p).to_bytes(4, "big") + p
                    for p in (role, *(part.encode() for part in parts)))
    return hmac.new(secret, data, hashlib.sha256).hexdigest()


def canonical(body: dict) -> str:
    """The request as the proof covers it (the same text on both ends)."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def ask(line: Line, secret: bytes, rank: int, kind: str, body: dict,
        timeout: float) -> Message:
    """Rank 0's side: prove the secret to rank ``rank`` and ask it
    ``kind`` (probe or join); its answer (ready, joined or error).
    ProtocolError when it does not answer as a SpecChat rank (wire.Closed
    when it closed the connection first), NotOurs when it is one of another
    cluster."""
    deadline = time.monotonic() + timeout
    ours = secrets.token_hex(32)
    _send(line, {"hello": {"nonce": ours}})
    challenge = wire.check(line.read_one(timeout), ["challenge"]).body
    if challenge["rank"] != rank:
        raise NotOurs(f"is rank {challenge['rank']} of its cluster, not rank {rank}")
    expected = proof(secret, RANK, ours, challenge["nonce"], str(rank))
    if not hmac.compare_digest(challenge["proof"], expected):
        raise NotOurs("holds another secret than this cluster's (a rank of another cluster, "
                      "or of this one created again)")
    _send(line, {kind: body,
                 "proof": proof(secret, RANK_0, challenge["nonce"], ours, kind, canonical(body))})
    return wire.check(line.read_one(max(0.0, deadline - time.monotonic())), ANSWERS)


def _send(line: Line, message: dict) -> None:
    """Send as ``ask`` reads: a failure is a ProtocolError, as its reads' are."""
    try:
        line.send(message)
    except ConnectionError as exc:
        raise wire.Closed(f"the connection failed ({exc.strerror or exc})") from None
    except OSError as exc:
        raise ProtocolError(f"the connection failed ({exc.strerror or exc})") from None


def challenge(secret: bytes, rank: int, hello: object) -> tuple[dict, tuple[str, str]]:
    """A rank's first step: rank 0's ``hello`` (ProtocolError when it is
    not one) gives the challenge to send back, and the two nonces ``verify``
    needs. Split from ``answer`` so that a rank's one loop over every
    connection (control.RankChannel) can take each step as its line comes."""
    theirs = wire.check(hello, ["hello"]).body["nonce"]
    ours = secrets.token_hex(32)
    return ({"challenge": {"nonce": ours, "rank": rank,
                           "proof": proof(secret, RANK, theirs, ours, str(rank))}},
            (theirs, ours))


def verify(secret: bytes, nonces: tuple[str, str], msg: object) -> Message:
    """A rank's second step: the request (probe or join) in ``msg`` if its
    proof covers this connection's nonces; ProtocolError otherwise."""
    theirs, ours = nonces
    request = wire.check(msg, ["probe", "join"], proof=True)
    expected = proof(secret, RANK_0, ours, theirs, request.kind, canonical(request.body))
    if not hmac.compare_digest(request.proof, expected):
        raise ProtocolError("a request without proof of the cluster's secret")
    return request


def answer(line: Line, secret: bytes, rank: int, timeout: float) -> Message:
    """A rank's side, on one blocking connection: the request (probe or
    join) of whoever connected, once it has proved the secret;
    ProtocolError otherwise."""
    deadline = time.monotonic() + timeout
    reply, nonces = challenge(secret, rank, line.read_one(timeout))
    line.send(reply)
    return verify(secret, nonces, line.read_one(max(0.0, deadline - time.monotonic())))
