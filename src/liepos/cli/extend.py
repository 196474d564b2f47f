"""``liepos extend MODEL --length L --text FILE``: measure every scaling map on your model and text, keep the best.

MODEL is a transformers checkpoint folder (``--gguf-file`` for a GGUF file inside it). The first
``L`` tokens of FILE are scored by the unpatched model and by the model patched with each map of
:data:`liepos.interop.hf_extend.MAPS` at ``factor = L / max_position_embeddings``
(:func:`liepos.interop.hf_extend.extend`): mean NLL per position bucket and past the trained length.
The map with the lowest NLL past the trained length is written as ``config.json`` into ``--out``
(the model's config with the map's entries from :func:`liepos.interop.to_hf`), so that the unpatched
model computes it; nothing is written when no map beats the model as it is.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from liepos.cli._common import UsageError, int_at_least, need_extra, out_dir, shown

HELP = "measure every context-extension map on a model and text at a length, write the best as a config"
EXAMPLES = [
    "liepos extend ./my-model --length 16384 --text book.txt --out ./my-model-16k",
    "liepos extend ./gguf-folder --gguf-file model.gguf --length 16384 --text book.txt --maps yarn linear",
]
# the maps a user may name (without importing torch to build the parser)
_MAPS = ("linear", "ntk", "dynamic", "yarn", "llama3")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="a transformers checkpoint folder")
    parser.add_argument("--length", type=int_at_least(2), required=True, help="the target length L in tokens")
    parser.add_argument("--text", required=True, help="a UTF-8 text file with at least L tokens")
    parser.add_argument("--gguf-file", default=None, help="a GGUF file inside MODEL to load instead of safetensors")
    parser.add_argument("--maps", nargs="+", choices=_MAPS, default=None, help="the maps to try (default: all)")
    parser.add_argument("--out", default=None, help="folder for the chosen map's config.json (default: write nothing)")
    parser.add_argument("--json", action="store_true", help="print the measurements as JSON")


def _load(args: argparse.Namespace, text: str):
    """``(ids (1, S), model)``: the text tokenized (checked against ``--length``) before the model loads."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(args.model)
    if not folder.is_dir():
        raise UsageError(f"MODEL must be a checkpoint folder, got {shown(args.model)}")
    extra = {} if args.gguf_file is None else {"gguf_file": args.gguf_file}
    if args.gguf_file is not None and not (folder / args.gguf_file).is_file():
        raise UsageError(f"--gguf-file {shown(args.gguf_file)} is not a file in {shown(args.model)}")
    transformers.utils.logging.disable_progress_bar()  # stderr carries the measurements, one line each
    try:
        ids = AutoTokenizer.from_pretrained(str(folder), **extra)(text, return_tensors="pt").input_ids
        if ids.shape[1] < args.length:
            raise UsageError(f"--text {shown(args.text)} has {ids.shape[1]} tokens, fewer than --length {args.length}")
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, **extra).eval()
    except (OSError, ValueError) as err:
        raise UsageError(f"MODEL {shown(args.model)} does not load: {' '.join(str(err).split())[:300]}") from None
    return ids, model


def run(args: argparse.Namespace) -> int:
    need_extra("transformers", "hf")
    from liepos.interop.hf_extend import extend

    text_path = Path(args.text)
    if not text_path.is_file():
        raise UsageError(f"--text {shown(args.text)} is not a file")
    text = text_path.read_text(encoding="utf-8", errors="replace")
    out = None if args.out is None else out_dir("--out", args.out)
    ids, model = _load(args, text)
    L0 = getattr(model.config, "max_position_embeddings", None)
    if not isinstance(L0, int) or args.length <= L0:
        raise UsageError(f"--length {args.length} must exceed the model's max_position_embeddings ({L0})")
    try:
        result = extend(model, ids, args.length, maps=args.maps,
                        progress=lambda line: print(line, file=sys.stderr, flush=True))
    except NotImplementedError as err:
        raise UsageError(f"MODEL {shown(args.model)}: {err}") from None
    if args.json:
        print(json.dumps({"length": result.length, "original": result.original, "factor": result.factor,
                          "edges": result.edges, "nll": result.nll, "tail": result.tail, "best": result.best,
                          "config": result.config}, indent=2))
    else:
        print(f"{args.model} at L = {result.length} ({result.factor:g}× its {result.original}): mean NLL per "
              f"position bucket (nats) on the first {result.length} tokens of {args.text}\n")
        print(result.table())
    say = print if not args.json else (lambda line: print(line, file=sys.stderr))
    if result.best == "none":
        say(f"\nno map beats the model as it is past {result.original}: nothing written")
        return 0
    if out is not None:
        for key, value in result.config.items():
            setattr(model.config, key, value)
        model.config.save_pretrained(str(out))
        say(f"\nbest: {result.best}; wrote {out / 'config.json'} with {sorted(result.config)}")
    else:
        say(f"\nbest: {result.best}; its config entries (--out writes them): {json.dumps(result.config)}")
    return 0
