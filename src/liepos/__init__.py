"""liepos: every relative positional encoding is a one-parameter group A(u) = exp(uX).

RoPE, xPos, RetNet, ALiBi, NoPE, decay, Jordan blocks and every context-extension trick are
points of one space, chosen by one generator X. See the README for a tour.
"""

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
from liepos.encoding import Encoding
from liepos.generator import Generator, direct_sum

__version__ = "0.1.0"

__all__ = [
    "CATALOGUE",
    "KVCache",
    "attention",
    "attention_reference",
    "Encoding",
    "Generator",
    "alibi",
    "alibi_slopes",
    "build",
    "decay",
    "direct_sum",
    "jordan",
    "nope",
    "retnet",
    "rope",
    "rope_freqs",
    "xpos",
    "__version__",
]
