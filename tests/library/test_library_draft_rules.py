"""One set of rules and one set of words for every draft format.

A damaged EAGLE-3 head, a damaged MTP head and a damaged model folder are
refused by ``specchat models check`` and by the engine's own load in the
same words, before any weights are built (a config stating a million
layers was built for 41 s, then failed as out of memory, while the check
passed it); every good variant (negative layer ids, a float d2t, ...) is
accepted by both. Each side runs in a child process with a timeout, so a
FIFO that blocks a reader fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import pytest
from tinymodels import add_mtp, build_arch, build_eagle3

TIMEOUT = 120
ERROR = "specchat: error: "

# The engine's side: each folder loaded by a fresh Engine (the API the
# command line's jobs run), with what happened, as JSON lines.
ENGINE_LOADS = r"""
import json, sys
from specchat import startup
startup.prepare()
from specchat.engine.events import DraftSettings, GenerateRequest
from specchat.engine.session import Engine
from specchat.errors import SpecChatError
target, mode = sys.argv[1], sys.argv[2]
def mtp_built(e):
    try:
        return e.drafter("mtp") is not None
    except SpecChatError:
        return False
for arg in sys.argv[3:]:
    e = Engine()
    try:
        if mode == "head":
            e.load(target, arg)
        elif mode == "mtp":
            e.load(arg, "mtp")
        else:
            e.load(arg)
    except SpecChatError as exc:
        print(json.dumps({"error": str(exc),
                          "target_loaded": e.target is not None,
                          "draft_built": e.draft is not None or mtp_built(e)}))
        continue
    drafted = 0
    if mode != "model":
        r = e.generate(GenerateRequest(prompt_ids=(275, 364, 311, 78) * 4, max_tokens=12,
                                       draft=DraftSettings(mode=mode if mode == "mtp" else "draft",
                                                           k=3)))
        drafted = r.summary.drafted
    print(json.dumps({"loaded": True, "drafted": drafted}))
"""


def _engine(target: Path | str, mode: str, folders: list[Path]) -> list[dict]:
    done = subprocess.run([sys.executable, "-c", ENGINE_LOADS, str(target), mode,
                           *map(str, folders)], capture_output=True, text=True,
                          timeout=TIMEOUT, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


# The command line's side: ``specchat models check`` (its main, on argv) for
# each case in one child, its exit status and output as JSON lines; the
# reported commands run as real ``specchat`` processes besides (_commands).
CHECKS = r"""
import contextlib, io, json, sys
from specchat.cli import main
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    print(json.dumps([rc, out.getvalue(), err.getvalue()]))
"""


def _checks(*argvs: list[str]) -> list[subprocess.CompletedProcess]:
    done = subprocess.run([sys.executable, "-c", CHECKS, json.dumps(argvs)], capture_output=True,
                          text=True, timeout=TIMEOUT, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-3000:]
    return [subprocess.CompletedProcess(argv, *json.loads(line))
            for argv, line in zip(argvs, done.stdout.splitlines(), strict=True)]


def _commands(*argvs: list[str]) -> list[subprocess.CompletedProcess]:
    """Real ``specchat`` processes, two at a time (the machine has two cores)."""
    out = []
    for i in range(0, len(argvs), 2):
        procs = [subprocess.Popen([sys.executable, "-m", "specchat", *argv], text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=dict(os.environ)) for argv in argvs[i:i + 2]]
        for argv, p in zip(argvs[i:i + 2], procs, strict=True):
            stdout, stderr = p.communicate(timeout=TIMEOUT)
            out.append(subprocess.CompletedProcess(argv, p.returncode, stdout, stderr))
    return out


def _check_says(done: subprocess.CompletedProcess) -> str:
    """What ``specchat models check`` refused with: its one error line, or
    the reason under a NOT compatible verdict."""
    assert done.returncode == 1, (done.stdout, done.stderr)
    if done.stderr.startswith(ERROR):
        return done.stderr.strip().removeprefix(ERROR)
    assert "NOT compatible" in done.stdout, done.stdout
    return next(line.strip().removeprefix("- ") for line in done.stdout.splitlines()
                if line.startswith("  - "))


# -- damage -----------------------------------------------------------------------


def _config(edit: Callable[[dict, dict], object]) -> Callable[[Path], None]:
    """Edit a speculators head's config (the whole, its layer's)."""
    def damage(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        edit(config, config["transformer_layer_config"])
        (folder / "config.json").write_text(json.dumps(config))
    return damage


def _weights(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        weights = dict(mx.load(str(folder / "model.safetensors")))
        edit(weights)
        mx.save_safetensors(str(folder / "model.safetensors"), weights)
    return damage


def _replace(name: str, make: Callable[[Path], None]) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        (folder / name).unlink()
        make(folder / name)
    return damage


def _text(name: str, text: str) -> Callable[[Path], None]:
    return lambda folder: (folder / name).write_text(text)


def _truncate(name: str) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[:len(data) - 100])
    return damage


def _both(*damages: Callable[[Path], None]) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        for d in damages:
            d(folder)
    return damage


def _set(**values) -> Callable[[dict, dict], None]:
    return lambda config, layer: layer.update(values)


def _set_top(**values) -> Callable[[dict, dict], None]:
    return lambda config, layer: config.update(values)


CONFIG = "config.json: "
# Damaged heads: the damage, and words the one message holds. Every size a
# config states, every field's type, every tensor's shape, the maps.
DAMAGED_HEADS: dict[str, tuple[Callable[[Path], None], str]] = {
    "layers-million": (_config(_set(num_hidden_layers=1_000_000)),
                       CONFIG + "transformer_layer_config.num_hidden_layers must be a whole "
                       "number from 1 to 16; got 1000000 (int)"),
    "layers-zero": (_config(_set(num_hidden_layers=0)),
                    "num_hidden_layers must be a whole number from 1 to 16; got 0"),
    "layers-two-weights-one": (_config(_set(num_hidden_layers=2)),
                               "does not fit together: its config describes 2 layers, but its "
                               "weights hold 1"),
    "heads-zero": (_config(_set(num_attention_heads=0)),
                   "num_attention_heads must be a whole number from 1 to 1,024; got 0 (int)"),
    "heads-text": (_config(_set(num_attention_heads="4")),
                   "num_attention_heads must be a whole number from 1 to 1,024; got '4' (str)"),
    "kv-heads-not-a-divisor": (_config(_set(num_key_value_heads=3)),
                               "num_attention_heads (4) must be a multiple of "
                               "num_key_value_heads (3)"),
    "hidden-missing": (_config(lambda c, layer: layer.pop("hidden_size")),
                       "lacks transformer_layer_config.hidden_size, which an EAGLE-3 head's "
                       "config states"),
    "layer-config-list": (_config(lambda c, layer: c.update(transformer_layer_config=[1, 2])),
                          CONFIG + "transformer_layer_config must be an object (the config of "
                          "the head's layer); got a list of 2"),
    "layer-config-text": (_config(lambda c, layer: c.update(transformer_layer_config="llama")),
                          "transformer_layer_config must be an object (the config of the "
                          "head's layer); got 'llama' (str)"),
    "rope-list": (_config(_set(rope_scaling=[1])),
                  "transformer_layer_config.rope_scaling must be an object (or null); got a "
                  "list of 1"),
    "rope-unknown": (_config(_set(rope_scaling={"rope_type": "wobbly"})),
                     'is an EAGLE-3 head with a rope scaling of type "wobbly", which mlx-lm '
                     "cannot build (mlx-lm knows no such type)"),
    "rope-factor-zero": (_config(_set(rope_scaling={"rope_type": "linear", "factor": 0})),
                         "its factor is 0 (int), not a number above 0"),
    "rope-theta-negative": (_config(_set(rope_theta=-1)),
                            "rope_theta must be a number above 0; got -1 (int)"),
    "eps-infinite": (_config(_set(rms_norm_eps=1e400)),
                     "rms_norm_eps must be a number above 0; got inf (float)"),
    "flag-text": (_config(_set_top(norm_before_residual="yes")),
                  "norm_before_residual must be true or false; got 'yes' (str)"),
    "draft-vocab-past-vocab": (_config(_set_top(draft_vocab_size=401)),
                               "draft_vocab_size (401) must be at most its target's vocab_size "
                               "(400)"),
    "layer-ids-two": (_config(_set_top(eagle_aux_hidden_state_layer_ids=[2, 3])),
                      "eagle_aux_hidden_state_layer_ids must name the 3 target layers it reads "
                      "(whole numbers); got a list of 2"),
    "layer-ids-text": (_config(_set_top(eagle_aux_hidden_state_layer_ids=["2", "3", "3"])),
                       "eagle_aux_hidden_state_layer_ids must name the 3 target layers it reads"),
    "hidden-unlike-weights": (_config(_set(hidden_size=48)),
                              "tensor fc.weight has shape [64, 192] (in model.safetensors) but "
                              "its config implies [48, 192]"),
    "fc-wrong": (_weights(lambda w: w.update({"fc.weight": mx.zeros((64, 128))})),
                 "tensor fc.weight has shape [64, 128] (in model.safetensors) but its config "
                 "implies [64, 192]"),
    "extra-tensor": (_weights(lambda w: w.update({"fc.scales": mx.zeros((64, 3))})),
                     "does not fit together: tensor fc.scales (in model.safetensors) is not "
                     "part of the head its config describes"),
    "tensor-missing": (_weights(lambda w: w.pop("norm.weight")),
                       "is incomplete: its weights lack norm.weight, which its config describes"),
    "integer-weights": (_weights(lambda w: w.update({"norm.weight": mx.zeros((64,), mx.int32)})),
                        "tensor norm.weight is of dtype I32 (in model.safetensors); a head's "
                        "weights are floats"),
    "d2t-two-dimensional": (_weights(lambda w: w.update({"d2t": w["d2t"].reshape(1, -1)})),
                            "model.safetensors: the head's d2t has shape [1, 256], not a list "
                            "of ids"),
    "d2t-too-short": (_weights(lambda w: w.update({"d2t": w["d2t"][:200]})),
                      "the head's d2t maps 200 draft ids, but it drafts over 256 (its "
                      "draft_vocab_size)"),
    "d2t-missing": (_weights(lambda w: w.pop("d2t")),
                    "drafts over 256 ids but ships no d2t to map them into its target's 400"),
    "d2t-fractions": (_weights(lambda w: w.update({"d2t": w["d2t"].astype(mx.float32) + 0.5})),
                      "the head's d2t holds numbers that are not whole, not ids"),
    "d2t-bool": (_weights(lambda w: w.update({"d2t": w["d2t"].astype(mx.bool_)})),
                 "the head's d2t is of dtype BOOL, not numbers of ids"),
    "t2d-huge": (_weights(lambda w: w.update({"t2d": mx.zeros(((1 << 22) + 1,), mx.bool_)})),
                 "the head's t2d holds 4,194,305 ids, more than any vocabulary (4,194,304 at "
                 "most)"),
    "weights-truncated": (_truncate("model.safetensors"),
                          "model.safetensors is truncated: its tensors need"),
    "config-not-json": (_text("config.json", '{"architectures": '),
                        "config.json is broken: it is not valid JSON"),
    "config-nested-deep": (_text("config.json", "[" * 100_000),
                           "config.json is broken: it is nested too deeply to read"),
    "config-fifo": (_replace("config.json", os.mkfifo),
                    "config.json is broken: it is a FIFO (named pipe), not a regular file"),
    "weights-fifo": (_replace("model.safetensors", os.mkfifo),
                     "model.safetensors is broken: it is a FIFO (named pipe), not a regular file"),
    "weights-device": (_replace("model.safetensors", lambda p: p.symlink_to("/dev/zero")),
                       "model.safetensors is broken: it is a character device, not a regular "
                       "file"),
    # Made for another target: the engine needs the target's facts, so the
    # target loads first; the head is never built.
    "another-width": (lambda f: None, "is an EAGLE-3 head for another model and cannot draft "
                      "for target-llama: it reads hidden states of width 32, target-llama has "
                      "64"),
    "map-past-vocabulary": (lambda f: None, "'s vocabulary map does not fit target-llama: its "
                            "d2t maps 56 draft ids outside target-llama's 400 ids"),
}
FIT_CASES = {"another-width": {"hidden": 32}, "map-past-vocabulary": {"wrap": False}}

# Good variants: each loads, drafts and is compatible on both sides.
GOOD_HEADS: dict[str, Callable[[Path], None]] = {
    "as-published": lambda f: None,
    "negative-layer-ids": _config(_set_top(eagle_aux_hidden_state_layer_ids=[-1, 3, 4])),
    "float32-d2t": _weights(lambda w: w.update({"d2t": w["d2t"].astype(mx.float32)})),
    "bfloat16-d2t": _weights(lambda w: w.update({"d2t": w["d2t"].astype(mx.bfloat16)})),
    "int32-d2t-no-t2d": _weights(lambda w: (w.update({"d2t": w["d2t"].astype(mx.int32)}),
                                            w.pop("t2d"))),
    "null-optional-fields": _config(lambda c, layer: layer.update(head_dim=None,
                                                                  rope_scaling=None)),
    "config-wrong-head-dim": _config(_set(head_dim=8)),  # the weights' 16 decide
    "rope-llama3": _config(_set(rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                              "original_max_position_embeddings": 64})),
}


@pytest.fixture(scope="module")
def base_head(tiny_dir, tiny_target) -> Path:
    return build_eagle3(tiny_dir / "rules-eagle3", tiny_target, layout="speculators")


def _heads(tmp_path: Path, base: Path, cases: dict, tiny_target: Path) -> list[Path]:
    out = []
    for name, case in cases.items():
        damage = case[0] if isinstance(case, tuple) else case
        folder = tmp_path / name
        if name in FIT_CASES:
            build_eagle3(folder, tiny_target, layout="speculators", **FIT_CASES[name])
        else:
            shutil.copytree(base, folder)
        damage(folder)
        out.append(folder)
    return out


def test_a_damaged_head_is_refused_by_the_check_and_the_engine_in_the_same_words(
        lib_home, tmp_path, tiny_target, base_head):
    folders = _heads(tmp_path, base_head, DAMAGED_HEADS, tiny_target)
    loads = _engine(tiny_target, "head", folders)
    checks = _checks(*(["models", "check", str(tiny_target), str(f)] for f in folders))
    for folder, load, check in zip(folders, loads, checks, strict=True):
        words = DAMAGED_HEADS[folder.name][1]
        said = load.get("error")
        assert said is not None and words in said, (folder.name, load)
        assert _check_says(check) == said, folder.name
        assert not load["draft_built"], folder.name  # refused before a weight is built
        # The head's own files are checked before the target loads; only a
        # head for another target needs the target's facts first.
        assert load["target_loaded"] == (folder.name in FIT_CASES), folder.name
    # The real commands that load: refused the same, before the target is
    # read, and a head that cannot load is not imported either.
    million = folders[0]
    generate, imported = _commands(
        ["generate", "--target", str(tiny_target), "--draft", str(million), "--prompt", "Hi",
         "--max-tokens", "4"],
        ["models", "import", str(million)])
    for done in (generate, imported):
        assert done.returncode == 1 and done.stderr.startswith(ERROR), done.stderr
        assert done.stderr.strip().removeprefix(ERROR) == loads[0]["error"]
        assert "[target] reading" not in done.stderr


def test_each_good_head_variant_is_accepted_by_both(lib_home, tmp_path, tiny_target,
                                                    base_head):
    folders = _heads(tmp_path, base_head, GOOD_HEADS, tiny_target)
    loads = _engine(tiny_target, "head", folders)
    checks = _checks(*(["models", "check", str(tiny_target), str(f)] for f in folders))
    for folder, load, check in zip(folders, loads, checks, strict=True):
        assert load.get("loaded") and load["drafted"] > 0, (folder.name, load)
        assert check.returncode == 0 and ": compatible" in check.stdout, (folder.name,
                                                                           check.stdout,
                                                                           check.stderr)


# -- the target's own MTP head ------------------------------------------------------


@pytest.fixture(scope="module")
def mtp_base(tiny_dir, tiny_tokenizer) -> Path:
    return add_mtp(build_arch(tiny_dir / "rules-qwen3_5-mtp", tiny_tokenizer, "qwen3_5", seed=8))


def _model_config(**values) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **values}))
    return damage


def _renamed(old: str, new: str) -> Callable[[dict], None]:
    def edit(w: dict) -> None:
        for k in [k for k in w if k.startswith(old)]:
            w[new + k[len(old):]] = w.pop(k)
    return edit


def _no_mtp(w: dict) -> None:
    for k in [k for k in w if k.startswith("mtp.")]:
        del w[k]


CANNOT = "'s MTP head cannot draft ("
DAMAGED_MTP: dict[str, tuple[Callable[[Path], None], str]] = {
    "none": (_weights(_no_mtp), "has no MTP head (no mtp.* weights in its folder), so it "
             "cannot draft for itself"),
    "fc-wrong": (_weights(lambda w: w.update({"mtp.fc.weight": mx.zeros((64, 64))})),
                 CANNOT + "tensor mtp.fc.weight has shape [64, 64] but the model's hidden size "
                 "64 implies [64, 128])"),
    "layer-gap": (_weights(_renamed("mtp.layers.0.", "mtp.layers.1.")),
                  CANNOT + "its layers are numbered [1], not 0 to 0)"),
    "extra": (_weights(lambda w: w.update({"mtp.head.weight": mx.zeros((4, 4))})),
              CANNOT + "tensor mtp.head.weight is not part of an MTP head)"),
    "norm-missing": (_weights(lambda w: w.pop("mtp.norm.weight")),
                     CANNOT + "its weights lack mtp.norm.weight)"),
    "layer-unlike": (_weights(lambda w: w.update(
        {"mtp.layers.0.mlp.gate_proj.weight": mx.zeros((96, 64))})),
        CANNOT + "its layer is not one of the model's full-attention layers (tensor "
        "mtp.layers.0.mlp.gate_proj.weight differs))"),
    "experts-one-by-one": (_weights(lambda w: w.update(
        {"mtp.layers.0.mlp.experts.0.gate_proj.weight": mx.zeros((128, 64))})),
        CANNOT + "its layer holds its experts one by one (the Hub's layout), which SpecChat "
        "does not stack for the head)"),
    "count-unlike-config": (_model_config(mtp_num_hidden_layers=2), CANNOT + "the model's config says it has 2 layers (mtp_num_hidden_layers), its weights "
        "hold 1)"),
    # A count that is no whole number was passed over by both, the head's
    # layers counted from its weights: a size a config states is a whole
    # number, or the config is damaged.
    "count-not-whole": (_model_config(mtp_num_hidden_layers=1.5), CANNOT + "the model's config "
                        "says it has 1.5 (float) layers (mtp_num_hidden_layers), not a whole "
                        "number)"),
    "count-text": (_model_config(mtp_num_hidden_layers="1"), CANNOT + "the model's config says "
                   "it has '1' (str) layers (mtp_num_hidden_layers), not a whole number)"),
}


def test_the_models_own_mtp_head_is_checked_by_both_in_the_same_words(lib_home, tmp_path,
                                                                       mtp_base):
    """``specchat models check T mtp`` (once "Unknown model 'mtp'") and the
    engine's load with the target's own head (once, on the command line, a
    suffix-only reply with exit 0 for a target without one) say the same."""
    folders = []
    for name, (damage, _words) in DAMAGED_MTP.items():
        shutil.copytree(mtp_base, tmp_path / name)
        damage(tmp_path / name)
        folders.append(tmp_path / name)
    loads = _engine("-", "mtp", [*folders, mtp_base])
    checks = _checks(*(["models", "check", str(f), "mtp"] for f in [*folders, mtp_base]))
    for folder, load, check in zip(folders, loads[:-1], checks[:-1], strict=True):
        said = load.get("error")
        assert said is not None and said.startswith(folder.name), (folder.name, load)
        assert DAMAGED_MTP[folder.name][1] in said, (folder.name, said)
        assert _check_says(check) == said
        assert not load["target_loaded"], (folder.name, load)  # before the target is read
    assert loads[-1].get("loaded") and loads[-1]["drafted"] > 0, loads[-1]
    assert checks[-1].returncode == 0 and ": compatible" in checks[-1].stdout, checks[-1].stdout
    generate, check = _commands(["generate", "--target", str(folders[0]), "--draft", "mtp",
                                 "--prompt", "Hi", "--max-tokens", "4"],
                                ["models", "check", str(folders[0]), "mtp"])
    assert generate.returncode == 1, generate.stderr
    assert generate.stderr.strip().removeprefix(ERROR) == loads[0]["error"]
    assert _check_says(check) == loads[0]["error"]
    # A target whose MTP head cannot draft still loads, to decode or draft otherwise.
    (plain,) = _engine("-", "model", [folders[1]])
    assert plain == {"loaded": True, "drafted": 0}


# -- a model folder's own files ---------------------------------------------------------


DAMAGED_MODELS: dict[str, tuple[Callable[[Path], None], str]] = {
    "config-fifo": (_replace("config.json", os.mkfifo),
                    "config.json is broken: it is a FIFO (named pipe), not a regular file"),
    "tokenizer-fifo": (_replace("tokenizer.json", os.mkfifo),
                       "tokenizer.json is broken: it is a FIFO (named pipe), not a regular file"),
    "template-fifo": (_replace("chat_template.jinja", os.mkfifo),
                    "chat_template.jinja is broken: it is a FIFO (named pipe), not a regular "
                    "file"),
    "config-nested-deep": (_text("config.json", "[" * 100_000),
                           "config.json is broken: it is nested too deeply to read"),
    "tokenizer-nested-deep": (_text("tokenizer.json", "{\"model\": " + "[" * 60_000),
                              "tokenizer.json is broken: it is nested too deeply to read"),
    "tokenizer-null": (_text("tokenizer.json", "null"),
                       "tokenizer.json is broken: it is not a JSON object"),
    "tokenizer-list": (_text("tokenizer.json", "[1, 2]"),
                       "tokenizer.json is broken: it is not a JSON object"),
    "tokenizer-model-list": (_text("tokenizer.json", '{"model": [1]}'),
                             "tokenizer.json is broken: its model is not a JSON object"),
    "tokenizer-vocab-text": (_text("tokenizer.json", '{"model": {"vocab": {"a": "1"}}}'),
                             "tokenizer.json is broken: its model's vocab is not an object of "
                             "tokens and their ids"),
    "generation-config-list": (_text("generation_config.json", "[]"),
                               "generation_config.json is broken: it is not a JSON object"),
    "weights-link-to-nothing": (_replace("model.safetensors",
                                         lambda p: p.symlink_to(p.parent / "gone")),
                                "model.safetensors is broken: it is a link to"),
}


def test_a_model_folders_damaged_files_are_refused_by_both_in_the_same_words(
        lib_home, tmp_path, tiny_target, tiny_draft):
    """Every file of a model folder is checked before mlx-lm or transformers
    open it: a FIFO never blocks ``generate`` or ``models check``, JSON too
    deep to parse is no RecursionError, a tokenizer.json that is no
    tokenizer is said to be, by the check and the engine alike."""
    folders = []
    for name, (damage, _words) in DAMAGED_MODELS.items():
        shutil.copytree(tiny_target, tmp_path / name, symlinks=True)
        damage(tmp_path / name)
        folders.append(tmp_path / name)
    loads = _engine("-", "model", folders)
    checks = _checks(*(["models", "check", str(f), str(tiny_draft)] for f in folders))
    for folder, load, check in zip(folders, loads, checks, strict=True):
        said = load.get("error")
        assert said is not None and said.startswith(str(folder / "")), (folder.name, load)
        assert DAMAGED_MODELS[folder.name][1] in said, (folder.name, said)
        assert _check_says(check) == said, folder.name
    generate = _commands(*(["generate", "--target", str(f), "--plain", "--prompt", "Hi"]
                           for f in folders[:2]))
    for folder, load, done in zip(folders, loads, generate, strict=False):
        assert done.stderr.strip() == ERROR + load["error"], folder.name


def test_a_path_that_is_no_file_nor_folder_is_named_for_what_it_is(lib_home, tmp_path,
                                                                   tiny_target):
    """A ``.gguf`` link to /dev/zero was "not found"; a FIFO named like a
    model is said to be one too, and a link to nothing is a link."""
    device = tmp_path / "zero.gguf"
    device.symlink_to("/dev/zero")
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    dangling = tmp_path / "gone.gguf"
    dangling.symlink_to(tmp_path / "nowhere.gguf")
    said = _commands(*(["models", "check", str(p), str(tiny_target)]
                       for p in (device, fifo, dangling)))
    assert [d.stderr.strip() for d in said] == [
        f"{ERROR}{device} is a character device, not a model file or folder: SpecChat reads "
        "only regular files.",
        f"{ERROR}{fifo} is a FIFO (named pipe), not a model file or folder: SpecChat reads "
        "only regular files.",
        f"{ERROR}{dangling} is a link to {tmp_path / 'nowhere.gguf'}, which is not there."]
