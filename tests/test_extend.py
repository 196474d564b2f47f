"""liepos.interop.hf_extend and ``liepos extend``: every map measured on a tiny random Llama (trained
length 32) and generated text at L = 96, the best written back as a config that the unpatched model
reads as the measured encoding."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from liepos.cli import main  # noqa: E402
from liepos.interop import from_hf  # noqa: E402
from liepos.interop.hf_extend import MAPS, bucket_means, extend, scaling_maps, token_nll  # noqa: E402
from test_hf_model import tiny  # noqa: E402

pytestmark = pytest.mark.upstream
WORDS = [f"w{i}" for i in range(100)]
L = 96


def text(n=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    return " ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (n,), generator=g))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A folder with a tiny Llama (max_position_embeddings=32) and a word-level tokenizer of WORDS."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = tmp_path_factory.mktemp("tiny")
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]")
    tok.save_pretrained(folder)
    tiny(max_position_embeddings=32).save_pretrained(folder)
    (folder / "text.txt").write_text(text())
    return folder, tok


def test_token_nll_is_the_models_cross_entropy():
    model = tiny()
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(ids, labels=ids).loss
    nll = token_nll(model, ids)
    assert nll.shape == (39,) and abs(float(nll.mean()) - float(want)) < 1e-5
    assert bucket_means(nll, [0, 10, 39]) == [float(nll[:10].mean()), float(nll[10:].mean())]


def test_extend_measures_every_map_and_writes_back_the_best(checkpoint):
    folder, tok = checkpoint
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = tok(text(), return_tensors="pt").input_ids
    r = extend(model, ids, L)
    assert list(r.nll) == ["none", *MAPS] and r.factor == L / 32
    assert r.best == min(r.tail, key=r.tail.get)
    # "none" is the model as it is; each map's tail is its own NLL past 32
    assert r.tail["none"] == pytest.approx(float(token_nll(model, ids[:, :L])[32:].mean()))
    enc = scaling_maps(from_hf(model.config), factor=r.factor, original=32, names=["yarn"])["yarn"]
    assert r.tail["yarn"] == pytest.approx(float(token_nll(model, ids[:, :L], enc)[32:].mean()))
    assert len({round(v, 6) for v in r.tail.values()}) == len(r.tail)  # the maps do differ
    if r.best != "none":
        cfg = type(model.config).from_dict({**model.config.to_dict(), **r.config})
        enc = scaling_maps(from_hf(model.config), factor=r.factor, original=32, names=[r.best])[r.best]
        back = from_hf(cfg)
        if r.best == "dynamic":
            back, enc = back.at_length(L), enc.at_length(L)
        assert torch.allclose(back.generator.freqs, enc.generator.freqs, rtol=1e-12, atol=0)


def test_extend_refuses_what_it_cannot_measure():
    model = tiny(max_position_embeddings=32)
    ids = torch.zeros(1, 64, dtype=torch.long)
    with pytest.raises(ValueError, match="above max_position_embeddings=32"):
        extend(model, ids, 32)
    with pytest.raises(ValueError, match="S >= length=80"):
        extend(model, ids, 80)
    with pytest.raises(ValueError, match="unknown scaling maps"):
        extend(model, ids, 64, maps=["bogus"])


def test_the_command_prints_the_table_and_writes_the_config(checkpoint, tmp_path, capsys):
    folder, _ = checkpoint
    out = tmp_path / "out"
    rc = main(["extend", str(folder), "--length", str(L), "--text", str(folder / "text.txt"), "--out", str(out),
               "--maps", "linear", "yarn", "dynamic", "--json"])
    got = json.loads(capsys.readouterr().out)
    assert rc == 0 and set(got["nll"]) == {"none", "linear", "yarn", "dynamic"}
    if got["best"] == "none":
        assert not out.joinpath("config.json").exists()
    else:
        written = json.loads(out.joinpath("config.json").read_text())
        assert written["rope_parameters"] == got["config"]["rope_parameters"]


def test_the_command_refuses_bad_input(checkpoint, tmp_path, capsys):
    folder, _ = checkpoint
    short = tmp_path / "short.txt"
    short.write_text(text(10))
    for argv, needle in [
        (["extend", str(tmp_path / "none"), "--length", "96", "--text", str(short)], "checkpoint folder"),
        (["extend", str(folder), "--length", "96", "--text", str(short)], "fewer than --length 96"),
        (["extend", str(folder), "--length", "16", "--text", str(folder / "text.txt")], "max_position_embeddings"),
        (["extend", str(folder), "--length", "96", "--text", str(tmp_path / "nope.txt")], "is not a file"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and needle in err, (argv, err)
