"""liepos: every relative positional encoding is a one-parameter group A(u) = exp(uX).

RoPE, xPos, RetNet, ALiBi, NoPE, decay, Jordan blocks and every context-extension trick are
points of one space, chosen by one generator X. See the README for a tour.
"""

from liepos import scaling
from liepos.attention import KVCache, attention, attention_reference
from liepos.catalogue import (
    CATALOGUE,
    alibi,
    alibi_slopes,
    build,
    decay,
    jordan,
    nope,
    retnet,
    rope,
    rope_freqs,
    xpos,
)
from liepos.classify import Classification, classify
from liepos.diagnose import Diagnosis, diagnose
from liepos.encoding import Encoding
from liepos.generator import Generator, direct_sum
from liepos.interop.hf import from_hf

__version__ = "0.1.0"

__all__ = [
    "CATALOGUE",
    "Classification",
    "Diagnosis",
    "KVCache",
    "attention",
    "attention_reference",
    "Encoding",
    "Generator",
    "alibi",
    "alibi_slopes",
    "build",
    "classify",
    "decay",
    "diagnose",
    "direct_sum",
    "from_hf",
    "jordan",
    "nope",
    "retnet",
    "rope",
    "rope_freqs",
    "scaling",
    "xpos",
    "__version__",
]
