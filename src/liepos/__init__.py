"""liepos: every relative positional encoding is a one-parameter group A(u) = exp(uX).

RoPE, xPos, RetNet, ALiBi, NoPE, decay, Jordan blocks and every context-extension trick are
points of one space, chosen by one generator X. See the README for a tour.
"""

from liepos import scaling
from liepos.axes import (
    AXES_CATALOGUE,
    AxesEncoding,
    AxesGenerator,
    axial_rope,
    decay_axial_rope,
    mrope,
    rope_mixed,
)
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
from liepos.clock import Clock
from liepos.classify import Classification, classify
from liepos.diagnose import Diagnosis, diagnose
from liepos.encoding import Encoding
from liepos.generator import Generator, direct_sum
from liepos.interop.hf import from_hf
from liepos.learnable import LearnableEncoding, LearnableGenerator

__version__ = "0.1.0"

__all__ = [
    "AXES_CATALOGUE",
    "AxesEncoding",
    "AxesGenerator",
    "CATALOGUE",
    "Clock",
    "Classification",
    "Diagnosis",
    "KVCache",
    "LearnableEncoding",
    "LearnableGenerator",
    "attention",
    "attention_reference",
    "axial_rope",
    "Encoding",
    "Generator",
    "alibi",
    "alibi_slopes",
    "build",
    "classify",
    "decay",
    "decay_axial_rope",
    "diagnose",
    "direct_sum",
    "from_hf",
    "jordan",
    "mrope",
    "nope",
    "retnet",
    "rope",
    "rope_freqs",
    "rope_mixed",
    "scaling",
    "xpos",
    "__version__",
]
