"""``liepos diagnose TARGET``: probe Hugging Face's own rotary code, or a catalogue entry, as a black box."""

from __future__ import annotations

import argparse
import json

from liepos.cli._common import UsageError, int_at_least, need_extra, read_json, real_in, shown

HELP = "probe an existing implementation and say which point of the design space it is"
EXAMPLES = [
    "liepos diagnose hf:llama",
    "liepos diagnose hf:llama --rope '{\"rope_type\": \"yarn\", \"factor\": 4.0}'",
    "liepos diagnose lp:xpos --head-dim 16 --json",
]

# the probe holds one (dim x dim) matrix per probed position (~150): 512 is twice any model's head dim
_MAX_HEAD_DIM = 512


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="TARGET",
                        help="what to probe: hf:FAMILY (Hugging Face's own rotary code for a transformers model "
                             "type: llama, mistral, qwen2, ...) or lp:NAME (a liepos catalogue entry)")
    parser.add_argument("--rope", default=None,
                        help="JSON rope parameters for hf:*, e.g. '{\"rope_type\": \"yarn\", \"factor\": 4.0}', "
                             "or @file.json")
    parser.add_argument("--head-dim", type=int_at_least(1, _MAX_HEAD_DIM), default=64,
                        help="head dim of the probe (default 64)")
    parser.add_argument("--max-position", type=int_at_least(1), default=2048,
                        help="the config's max_position_embeddings (default 2048)")
    parser.add_argument("--tol", type=real_in(0.0, open_low=True), default=1e-3,
                        help="relative tolerance of every test (default 1e-3)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")


def _hf(args: argparse.Namespace, family: str):
    need_extra("transformers", "hf")
    from liepos.diagnosis import hf_encoder

    rope = None if args.rope is None else read_json("--rope", args.rope)
    if rope is not None and not isinstance(rope, dict):
        raise UsageError(f"--rope must be a JSON object, got {shown(args.rope)}")
    try:
        enc, _ = hf_encoder(family, rope, head_dim=args.head_dim, max_position_embeddings=args.max_position)
    except ValueError as err:  # hf_encoder's refusal of the family, the head dim or the rope parameters
        given = f"{args.target} --head-dim {args.head_dim}" + (f" --rope {shown(args.rope)}" if rope else "")
        raise UsageError(f"{given}: {err}") from None
    return enc, enc, f"{args.target} {json.dumps(rope or {})}"


def _lp(args: argparse.Namespace, name: str):
    from liepos.catalogue import build

    if args.rope is not None:
        raise UsageError(f"--rope applies to hf: targets only, got it with {shown(args.target)}")
    try:
        e = build(name, args.head_dim, 1)  # one head: the probe's queries and keys are (1, 1, seq, dim)
    except ValueError as err:  # an unknown name, or a head dim the entry refuses
        raise UsageError(f"{args.target} --head-dim {args.head_dim}: {err}") from None
    return e.query, e.key, args.target


def run(args: argparse.Namespace) -> int:
    need_extra("scipy", "algebra")
    from liepos.diagnosis import ProbeError, diagnose

    kind, _, name = args.target.partition(":")
    if kind not in ("hf", "lp") or not name:
        raise UsageError(f"TARGET must be hf:FAMILY (e.g. hf:llama) or lp:NAME (e.g. lp:rope), got {shown(args.target)}")
    fq, fk, label = (_hf if kind == "hf" else _lp)(args, name)
    try:
        d = diagnose(fq, fk, dim=args.head_dim, tol=args.tol, label=label)
    except ProbeError as err:  # the target answered a probe with a wrong shape or NaN/inf
        raise UsageError(f"{args.target}: {err}") from None
    print(json.dumps(d.to_dict(), indent=2) if args.json else d)
    return 0
