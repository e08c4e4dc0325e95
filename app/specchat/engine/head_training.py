"""Training an EAGLE-3 draft head for the loaded target, on this machine.

The data is text (the person's conversations, documentation and source
files found on the machine), placed in the target's chat template, and
requests the target answers itself (``TrainPlan.requests``: the target's
greedy reply is written when the request's turn comes, and learnt from with
it): the head drafts through the target's own words, not someone else's,
so replies are the closer data, at the cost of their decoding time. The
labels are the target's own: one forward over each sample gives both its
next-token choice at every position and the hidden states of the three
layers the head reads (eagle3.py), so the head learns the target, not the
text. The head starts from the target (its output layer's rows for the
draft vocabulary and its final norm, both kept frozen, so the head learns
to reach the target's output space rather than a new one; the target's
embedding shared) and trains with EAGLE-3's
training-time test: each position also drafts two tokens further from the
head's own output, attending to the target's rows before it and its own
chain, as it will when it drafts; later steps weigh less (0.8^j). Labelling a piece costs a target forward and
an update only a head's, so each labelled piece is kept (its features in
half precision) and learnt from ``passes`` times on average, in windows of
``train_len`` tokens; the learning rate warms up over the first updates.
The draft vocabulary is the text's 8192 most frequent ids by default: a
head trained on thousands, not millions, of tokens learns a small output
layer better than a large one.

It runs on the engine thread (``EngineClient.train_head`` submits it):
a time budget, a checkpoint every ``checkpoint_s`` that a killed run resumes
from (the head in the published ``speculators`` layout, the optimizer, the
position in the data), and a held-out split whose acceptance per draft
position is reported as training goes. Greedy acceptance of position j is
the share of held-out positions whose first j drafts all match the target
(in a request's piece, only the positions of the reply a draft would write).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten

from specchat import records
from specchat.engine import chat, checkpoint, folders
from specchat.engine.checkpoint import TrainingState
from specchat.engine.compat import facts_from_tokenizer
from specchat.engine.eagle3 import Eagle3Head
from specchat.engine.eagle3_format import HeadConfig, published_config
from specchat.engine.errors import EngineError
from specchat.engine.events import (
    TRAINING_OPTIMIZER,
    TRAINING_STATE,
    DraftSettings,
    GenerateRequest,
    TrainPlan,
    TrainProgress,
)
from specchat.engine.modes import HYBRID, PLAIN, SUFFIX

STEP_WEIGHT = 0.8  # the loss of draft position j weighs 0.8^(j-1)
MIN_PIECES = 8  # kept pieces before each labelled piece earns its full share of updates
BUFFER_BYTES = 1 << 30  # the kept features' memory, at most


def _fingerprint(engine) -> str:
    cfg = engine.target.config
    facts = facts_from_tokenizer(engine.target.tokenizer).fingerprint()
    return hashlib.sha256(json.dumps([facts, cfg.get("hidden_size"), cfg.get("num_hidden_layers"),
                                      engine.target.info.n_params]).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Request:
    """A prompt whose reply the target writes when the piece is learnt from."""

    prompt: tuple[int, ...]


def _held_out(ids: Sequence[int], share: float) -> bool:
    """Held out by a hash of the ids, so a resumed run splits the same way."""
    return hashlib.sha256(json.dumps(list(ids)).encode()).digest()[0] / 256 < share


def _sequences(engine, plan: TrainPlan) -> tuple[list, list]:
    """The samples rendered in the chat template and cut to ``seq_len``,
    and the requests (kept whole, as Request): (training, held out). The
    held-out list alternates requests and text, so the few pieces measured
    include the target's own replies whenever there are requests."""
    train, held_text, held_requests = [], [], []
    for messages in plan.samples:
        ids = chat.render(engine.target.tokenizer, messages)
        for start in range(0, len(ids), plan.seq_len):
            chunk = ids[start:start + plan.seq_len]
            if len(chunk) >= 16:
                (held_text if _held_out(chunk[:64], plan.held_out) else train).append(chunk)
    for messages in plan.requests:
        prompt = tuple(chat.render(engine.target.tokenizer, messages))
        (held_requests if _held_out(prompt, plan.held_out) else train).append(Request(prompt))
    held = [p for pair in itertools.zip_longest(held_requests, held_text) for p in pair
            if p is not None]
    if not train or not held:
        raise EngineError(f"Too little text to train a draft head: {len(train)} training and "
                          f"{len(held)} held-out pieces of up to {plan.seq_len} tokens; add "
                          "conversations or text files.")
    return train, held


def _draft_ids(train: list, vocab: int, n: int, always: Sequence[int]) -> list[int]:
    """The draft vocabulary: the most frequent ids of the text and the
    requests' prompts (the target mostly writes what it reads; replies are
    not written yet), with the end tokens, sorted."""
    counts = Counter(t for seq in train for t in (seq.prompt if isinstance(seq, Request) else seq))
    top = [t for t, _ in counts.most_common(max(0, n - len(always)))]
    return sorted({*top, *(t for t in always if 0 <= t < vocab)})[:n]


def head_config(engine, draft_vocab: int, intermediate: int = 0) -> HeadConfig:
    cfg = engine.target.config.get("text_config", engine.target.config)
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    return HeadConfig(
        hidden_size=hidden, intermediate_size=intermediate or 2 * hidden,
        num_layers=1, num_heads=heads, num_kv_heads=int(cfg.get("num_key_value_heads", heads)),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        vocab_size=int(engine.target_runner.trunk.embed_tokens.weight.shape[0]),
        draft_vocab_size=draft_vocab, target_hidden_size=hidden, layer_ids=None,
        norm_before_residual=False, tie_word_embeddings=False)


def _padded(x: mx.array, n: int) -> mx.array:
    """``x`` cut or padded with zeros to n (rows past a sample: their loss is masked)."""
    if x.shape[0] >= n:
        return x[:n]
    return mx.concatenate([x, mx.zeros((n - x.shape[0],), dtype=x.dtype)])


def _read_tensors(path: Path, restart_how: str) -> dict[str, mx.array]:
    """A checkpoint's safetensors file (MLX checks its header against the
    file's size: a cut-short file is said to be)."""
    try:
        return mx.load(str(path))
    except (RuntimeError, ValueError, OSError) as exc:
        raise checkpoint.damaged(path, f"cannot be read ({exc})", restart_how) from None


def _described(arrays: dict[str, mx.array]) -> dict[str, checkpoint.Tensor]:
    """Each array's shape and kind, as the checkpoint checks compare them."""
    def kind(a: mx.array) -> str:
        return ("bool" if a.dtype == mx.bool_ else
                "float" if mx.issubdtype(a.dtype, mx.floating) else
                "int" if mx.issubdtype(a.dtype, mx.integer) else str(a.dtype))

    return {name: (tuple(a.shape), kind(a)) for name, a in arrays.items()}


class _StepCache:
    """The head layer's KV cache in training-time test: step j's keys and
    values join the earlier steps' (the mask says which rows see which),
    and its rows sit at position p + j (the layer's rope reads offset + 1)."""

    def __init__(self):
        self.keys: list[mx.array] = []
        self.values: list[mx.array] = []
        self.offset = 0

    def update_and_fetch(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        self.keys.append(k)
        self.values.append(v)
        self.offset += 1
        return mx.concatenate(self.keys, axis=2), mx.concatenate(self.values, axis=2)


class Trainer:
    """One run of ``train``: the plan's pieces split (``train``, ``held``),
    the head, its optimizer and checkpoint. Public, as the pieces it learns
    from are (``piece``: a request's prompt and the target's own reply): the
    tests check the split and the pieces, and slow down ``label_held`` to
    stand for a large target."""

    def __init__(self, engine, plan: TrainPlan):
        if engine.target is None or engine.target_runner is None or not engine.target_runner.split:
            raise EngineError("Load the target first; its model type must expose its hidden "
                              "states (llama, Qwen 2/3/3.5 and alike).")
        self.engine, self.plan = engine, plan
        self.runner = engine.target_runner
        # Before anything is read: a folder that is not the head's own is
        # refused in words; then it is taken for this run alone (made if
        # need be, removed again if nothing is saved into it).
        made = not os.path.lexists(folders.training_folder(plan.out))
        self.out = folders.training_folder(plan.out, make=True)
        self._made, self._lock = made, folders.hold_training_folder(self.out)
        try:
            self._prepare()
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Let the folder go (another run may take it), removing it if this
        run made it and saved nothing there."""
        if self._lock is None:
            return
        if self._made:  # while it is still this run's
            with contextlib.suppress(OSError):
                self.out.rmdir()  # only if empty
        os.close(self._lock)
        self._lock = None

    def _prepare(self) -> None:
        engine, plan = self.engine, self.plan
        vocab = int(self.runner.trunk.embed_tokens.weight.shape[0])
        fp = _fingerprint(engine)
        saved = None if plan.restart else self._saved(fp, vocab)
        self.train, self.held = _sequences(engine, plan)
        self.layers = len(self.runner.trunk.layers)
        self.resumed = saved is not None
        self.state = saved or TrainingState(target=fp, draft_ids=_draft_ids(
            self.train, vocab, min(plan.draft_vocab, vocab), sorted(engine.end_ids)))
        self._claimed = self.resumed  # the folder holds this run's state (it is the head's)
        c = head_config(engine, len(self.state.draft_ids), plan.intermediate)
        width = (checkpoint.read_intermediate(self.out, c.hidden_size, plan.restart_how)
                 if self.resumed else None)
        c = replace(c, intermediate_size=width) if width else c
        self.config = c
        self.read = c.read_layers(self.layers)
        self.head = Eagle3Head(c, shared_embed=self.runner.trunk.embed_tokens)
        self.rows = mx.array(self.state.draft_ids, dtype=mx.int32)
        self.t2d = mx.full((c.vocab_size,), -1, dtype=mx.int32)
        self.t2d[self.rows] = mx.arange(len(self.state.draft_ids), dtype=mx.int32)
        warmup = max(plan.warmup, 1)
        self.optimizer = optim.AdamW(
            learning_rate=lambda step: plan.lr * mx.minimum((step + 1) / warmup, 1.0),
            weight_decay=0.0)
        self.buffer: list[tuple[mx.array, mx.array, mx.array]] = []  # (feats, labels, ids)
        self.cancelled: threading.Event | None = None
        self.rng = random.Random(plan.seed + 1)
        w = self.runner.output_rows(self.rows)
        if w is not None and not self.resumed:  # the target's own output layer (its rows)
            self.head.lm_head.weight = w
            norm = getattr(self.runner.trunk, "norm", None)  # and its final norm
            if isinstance(norm, nn.RMSNorm):
                self.head.norm.weight = norm.weight.astype(mx.float32)
        self.head.d2t = self.rows - mx.arange(len(self.state.draft_ids), dtype=mx.int32)
        self.head.freeze(keys=["d2t"])
        if w is not None:  # kept as the target's: the head learns to reach its output space
            self.head.lm_head.freeze()
            self.head.norm.freeze()
        if self.resumed:  # checked against the head as built, frozen parts and all
            self._load()
        mx.eval(self.head.parameters())
        self.loss_and_grad = nn.value_and_grad(self.head, self._loss)

    # -- state on disk ---------------------------------------------------------------
    def _saved(self, fingerprint: str, vocab: int) -> TrainingState | None:
        """The checkpoint's state to go on from, checked; None when the
        folder holds none (a new folder, or a run that saved no head yet:
        its state says step 0). A state whose head is missing, or is no
        regular file, is a damaged checkpoint, said to be; it used to be
        started over silently, the training it stood for written over."""
        how = self.plan.restart_how
        if not checkpoint.present(self.out / TRAINING_STATE, how):
            return None
        state = checkpoint.read_state(self.out, vocab, how)
        if state.target != fingerprint:
            raise EngineError(f"{self.out} holds a head trained for another target; nothing was "
                              f"changed. Train into another folder, or to start over in that "
                              f"one, {how}.")
        if not checkpoint.present(self.out / "model.safetensors", how):
            if state.step == 0:
                return None
            raise checkpoint.damaged(self.out / "model.safetensors",
                                     f"is missing, though {TRAINING_STATE} says {state.step:,} "
                                     "updates were made", how)
        return state

    def _load(self) -> None:
        """The head's weights and the optimizer's state from the checkpoint,
        each file checked first against what ``save`` writes for this head
        (the same names, shapes and kinds) and the state (the same draft ids)."""
        how = self.plan.restart_how
        path = self.out / "model.safetensors"
        weights = _read_tensors(path, how)
        checkpoint.check_tensors(path, _described(weights), _described(
            self.head.published_weights(self.state.draft_ids, self.config.vocab_size)), how)
        checkpoint.check_map(path, weights["d2t"].tolist(), self.state, how)
        self.head.load_weights([(k, v) for k, v in weights.items() if k not in ("d2t", "t2d")],
                               strict=False)
        path = self.out / TRAINING_OPTIMIZER
        if checkpoint.present(path, how):
            flat = _read_tensors(path, how)
            scalars = {"step": ((), "int"), "learning_rate": ((), "float")}
            checkpoint.check_tensors(path, _described(flat), {**scalars, **{
                f"{name}.{moment}": tensor
                for name, tensor in _described(dict(tree_flatten(
                    self.head.trainable_parameters()))).items() for moment in ("m", "v")}}, how)
            self.optimizer.state = tree_unflatten(list(flat.items()))

    def save(self) -> None:
        """Write the checkpoint, into a folder checked again (it may have
        changed since the run began) and made if need be. A fresh run
        writes its training state first, so the folder says it is a head's
        being trained before any weights are in it (folders.is_training_folder)."""
        out = folders.training_folder(self.out)
        folders.still_held(out, self._lock)
        if not self._claimed:  # step 0: a run killed before its head is saved is no checkpoint
            records.write_json(out / TRAINING_STATE, asdict(replace(self.state, step=0)))
            self._claimed = True
        weights = self.head.published_weights(self.state.draft_ids, self.config.vocab_size)
        checkpoint.write_atomic(out / "model.safetensors",
                      lambda p: mx.save_safetensors(str(p), weights))
        opt = dict(tree_flatten(self.optimizer.state))
        if opt:
            checkpoint.write_atomic(out / TRAINING_OPTIMIZER,
                          lambda p: mx.save_safetensors(str(p), opt))
        config = published_config(self.config, self.layers, self.engine.target.info.name)
        records.write_json(out / "config.json", config, indent=2)
        records.write_json(out / TRAINING_STATE, asdict(self.state))

    # -- the target's labels -----------------------------------------------------------
    def piece(self, item, cancelled: threading.Event | None = None) -> tuple[list[int], int]:
        """A piece's ids, and the first row whose draft the measure counts;
        for a request, its prompt and the target's own greedy reply (the last
        ``seq_len`` of them: the reply is what counts), counted from the row
        that drafts the reply's second token (its first comes from the
        target's prefill, never from a draft). The reply is decoded
        speculatively with whatever is loaded (suffix matches at least: a
        reply quotes its request); greedy, so its ids are plain decoding's."""
        if not isinstance(item, Request):
            return item, 0
        pair = self.engine.pair
        mode = HYBRID if pair is not None and pair.speculative_ok else (
            SUFFIX if self.engine.target.info.trimmable else PLAIN)
        reply = self.engine.generate(
            GenerateRequest(prompt_ids=item.prompt, max_tokens=self.plan.reply_tokens,
                            draft=DraftSettings(mode=mode.name)), cancelled)
        ids = [*item.prompt, *reply.token_ids][-self.plan.seq_len:]
        return ids, max(len(ids) - len(reply.token_ids) - 1, 0)

    def label(self, ids: list[int]) -> tuple[mx.array, mx.array]:
        """The target's features [L, 3H] at the head's layers and its own
        next-token choice [L] at every position, from one forward."""
        logits, tapped = self.runner.tapped_forward(ids, None, layers=self.read)
        feats = mx.concatenate([tapped[i] for i in self.read], axis=-1).astype(mx.float32)
        labels = mx.argmax(logits, axis=-1).astype(mx.int32)
        mx.eval(feats, labels)
        return feats, labels

    # -- the head, unrolled as it drafts -------------------------------------------------
    def _steps(self, feats: mx.array, ids: mx.array, labels: mx.array) -> list[mx.array]:
        """Logits over the draft vocabulary for draft positions 1..steps at
        every row p (the target's features after token p, the token at
        p + 1): step j attends to the target's rows up to p and to row p's
        own earlier steps (training-time test), through the head's own
        layer, as it drafts."""
        head = self.head
        T = feats.shape[0] - 1
        h = head.fc(feats[:T])[None]
        embed = head.shared_embed or head.embed_tokens
        causal = mx.tril(mx.ones((T, T), dtype=mx.bool_))
        diag = mx.eye(T, dtype=mx.bool_)
        cache, out = _StepCache(), []
        for j in range(1, self.plan.steps + 1):
            tokens = ids[1:T + 1] if j == 1 else _padded(labels[j - 1:], T)
            mask = mx.concatenate([causal] + [diag] * (j - 1), axis=1)
            h = head.layers[0](h, embed(tokens)[None], mask, cache)
            out.append(head.lm_head(head.norm(h[0])))
        return out

    def _targets(self, labels: mx.array, j: int, T: int) -> mx.array:
        """Draft-vocabulary column of the target's choice for position j of
        row p (-1: past the sample, or not in the draft vocabulary)."""
        idx = mx.arange(T) + j
        return mx.where(idx < labels.shape[0], self.t2d[labels[mx.minimum(idx, labels.shape[0] - 1)]],
                        -1)

    def _loss(self, feats: mx.array, ids: mx.array, labels: mx.array) -> mx.array:
        T = feats.shape[0] - 1
        total, weight = mx.array(0.0), 0.0
        for j, logits in enumerate(self._steps(feats, ids, labels), start=1):
            target = self._targets(labels, j, T)
            valid = target >= 0
            ce = nn.losses.cross_entropy(logits, mx.maximum(target, 0), reduction="none")
            w = STEP_WEIGHT ** (j - 1)
            total = total + w * mx.sum(mx.where(valid, ce, 0.0)) / mx.maximum(mx.sum(valid), 1)
            weight += w
        return total / weight

    def label_held(self) -> None:
        """Label the held-out pieces once per run (kept in half precision):
        a target forward each, and for a request the target's whole reply,
        so minutes on a large target; a run's budget starts after it.
        Cancelled midway, nothing is kept (a reply may have been cut short)."""
        if hasattr(self, "_held"):
            return
        held = []
        for item in self.held[:self.plan.held_pieces]:
            seq, first = self.piece(item, self.cancelled)
            if self.cancelled is not None and self.cancelled.is_set():
                return
            feats, labels = self.label(seq)
            held.append((feats.astype(mx.float16), labels, mx.array(seq, dtype=mx.int32), first))
            mx.eval(held[-1][:3])
        self._held = held

    def accept(self) -> tuple[float, ...]:
        """Held-out greedy acceptance of draft positions 1..steps."""
        self.label_held()
        if not hasattr(self, "_held"):  # cancelled while labelling them
            return ()
        hits = [0] * self.plan.steps
        rows = 0
        for feats, labels, ids, first in self._held:
            feats = feats.astype(mx.float32)
            T = feats.shape[0] - 1
            alive = mx.arange(T) >= first  # a request's own rows are not drafted
            for j, logits in enumerate(self._steps(feats, ids, labels), start=1):
                alive = alive & (mx.argmax(logits, axis=-1) == self._targets(labels, j, T))
                hits[j - 1] += int(mx.sum(alive).item())
            rows += max(T - first, 0)
        return tuple(h / max(rows, 1) for h in hits)

    def _measure(self) -> tuple[float, ...]:
        """The held-out acceptance now, added to the curve at the tokens
        labelled so far; nothing when the run was cancelled meanwhile (a
        held-out reply may have been cut short: the pieces are made again
        next time)."""
        if self.cancelled is not None and self.cancelled.is_set() and not hasattr(self, "_held"):
            return ()
        acc = self.accept()
        self.state.curve.append({"tokens": self.state.tokens, "accept": list(acc)})
        return acc

    # -- what the updates learn from ----------------------------------------------------
    def _keep(self, feats: mx.array, labels: mx.array, ids: mx.array) -> None:
        """Keep a labelled piece (features in half precision) for several
        updates: labelling costs a target forward, an update a head's."""
        self.buffer.append((feats.astype(mx.float16), labels, ids))
        mx.eval(self.buffer[-1])
        limit = min(self.plan.buffer_tokens, BUFFER_BYTES // (2 * feats.shape[-1]))
        while len(self.buffer) > 1 and sum(ids.shape[0] for _, _, ids in self.buffer) > limit:
            self.buffer.pop(0)

    def _window(self) -> tuple[mx.array, mx.array, mx.array]:
        """A random window of ``train_len`` tokens of a random kept piece."""
        feats, labels, ids = self.buffer[self.rng.randrange(len(self.buffer))]
        n = ids.shape[0]
        start = self.rng.randrange(max(n - self.plan.train_len, 0) + 1)
        end = start + self.plan.train_len
        return feats[start:end].astype(mx.float32), ids[start:end], labels[start:end]

    # -- the loop ------------------------------------------------------------------------
    def run(self, report: Callable[[TrainProgress], None], cancelled: threading.Event | None):
        """Train for this run's budget (``plan.minutes`` more, on top of what
        a resumed head had); the progress reports this run's time. The
        held-out pieces are labelled first, outside the budget: on a large
        target that takes minutes, which would otherwise leave a short
        budget no time to learn."""
        budget = self.plan.minutes * 60.0
        self.cancelled = cancelled  # a held-out reply being written stops too
        st = self.state
        n_held = min(self.plan.held_pieces, len(self.held))
        report(TrainProgress("measuring", st.step, st.tokens, 0.0, budget, resumed=self.resumed,
                             message=f"labelling {n_held} held-out pieces to measure the head "
                                     f"on, before the {self.plan.minutes:g}-minute budget starts"))
        self.label_held()
        before, start = st.elapsed_s, time.perf_counter()

        def progress(stage: str, loss=None, accept=(), message="") -> None:
            now = time.perf_counter() - start
            st.elapsed_s = before + now
            report(TrainProgress(stage, st.step, st.tokens, now, budget, loss, accept,
                                 self.resumed, message))

        if not st.curve and hasattr(self, "_held"):  # the untrained head's, for the curve
            progress("training", accept=self._measure(), message="the untrained head, held out")
        loss = self._train(progress, start, budget, cancelled)
        stopped = cancelled is not None and cancelled.is_set()
        if st.step == 0 and not self.resumed:  # nothing learnt: nothing to keep
            took = f" (labelling {st.tokens:,} tokens took it)" if st.tokens else ""
            why = ("cancelled before the first update" if stopped else
                   f"the {self.plan.minutes:g}-minute budget ended before the first "
                   f"update{took}; give it more minutes")
            progress("done", message=f"{why}; nothing was saved")
            return st
        acc = self._measure()
        self.save()
        progress("done", loss, acc, message="cancelled" if stopped else "")
        return st

    def _train(self, progress: Callable[..., None], start: float, budget: float,
               cancelled: threading.Event | None) -> float | None:
        """Label pieces and update the head on them until the budget (from
        ``start``), the step limit or a cancel ends it, checkpointing as the
        plan says; the last loss."""
        st = self.state
        order = list(range(len(self.train)))
        random.Random(self.plan.seed).shuffle(order)
        loss = None
        owed = 0.0  # updates still due on what is labelled
        last_ckpt = start
        while time.perf_counter() - start < budget:
            if cancelled is not None and cancelled.is_set():
                break
            if self.plan.max_steps is not None and st.step >= self.plan.max_steps:
                break
            if owed <= 0 or not self.buffer:
                due = self._label_next(order, cancelled)
                if due is None:
                    break  # mid-reply: that piece is written again on resume
                owed += due
                progress("labelling", loss)
                continue
            loss = self._update()
            owed -= 1
            if time.perf_counter() - last_ckpt >= self.plan.checkpoint_s:
                acc = self._measure()
                self.save()
                last_ckpt = time.perf_counter()
                progress("checkpoint", loss, acc)
            else:
                progress("training", loss)
        return loss

    def _label_next(self, order: list[int], cancelled: threading.Event | None) -> float | None:
        """Label the next training piece and keep it; the updates it is owed
        (None: cancelled while its reply was written)."""
        st = self.state
        seq, _ = self.piece(self.train[order[st.cursor % len(order)]], cancelled)
        if cancelled is not None and cancelled.is_set():
            return None
        self._keep(*self.label(seq), mx.array(seq, dtype=mx.int32))
        st.cursor += 1
        st.tokens += len(seq) - 1
        # Until a few pieces are kept (a fresh or resumed run), fewer
        # updates each, so they do not all fall on one piece.
        return (self.plan.passes * (len(seq) - 1) / self.plan.train_len
                * min(1.0, len(self.buffer) / MIN_PIECES))

    def _update(self) -> float:
        """One optimizer step on a random window of a kept piece; its loss."""
        value, grads = self.loss_and_grad(*self._window())
        if self.plan.clip:
            grads, _ = optim.clip_grad_norm(grads, self.plan.clip)
        self.optimizer.update(self.head, grads)
        mx.eval(self.head.parameters(), self.optimizer.state, value)
        self.state.step += 1
        return float(value.item())


def train(engine, plan: TrainPlan, report: Callable[[TrainProgress], None],
          cancelled: threading.Event | None = None) -> dict:
    """Train (or go on training) a head for the loaded target into
    ``plan.out``; returns the training record (specchat-training.json)."""
    trainer = Trainer(engine, plan)
    try:
        return _train(trainer, report, cancelled)
    finally:
        trainer.release()


def _train(trainer: Trainer, report: Callable[[TrainProgress], None],
           cancelled: threading.Event | None) -> dict:
    plan = trainer.plan
    st = trainer.state
    resumed = (f"going on from the checkpoint in {plan.out}: step {st.step:,}, "
               f"{st.tokens:,} tokens labelled, {st.elapsed_s / 60:.1f} min trained; "
               if trainer.resumed else "")
    report(TrainProgress("preparing", st.step, st.tokens, 0.0, plan.minutes * 60.0,
                         resumed=trainer.resumed,
                         message=f"{resumed}{len(trainer.train)} pieces to learn from, "
                                 f"{len(trainer.held)} held out"))
    return asdict(trainer.run(report, cancelled))
