"""ckpt's sans-IO checkpoint codec: states in, frames out, and back.

No sockets, files or databases here: bytes in, bytes out. See FORMAT.md for
the frame layout.

    enc = ChainEncoder()
    chain = []  # the frames since the last FULL one: what decoding the head needs
    for frame in (enc.replace(s1), enc.merge(patch)):
        chain = [frame.data] if frame.kind is FrameKind.FULL else [*chain, frame.data]
    assert decode(chain) == s1 + patch

The policy may start a new chain (a FULL frame) at any write, small states
often: so a chain to decode starts at the last FULL frame, as above.

The encoder, the decoder and the rest are imported when one of their names is first used (PEP 562):
``ckpt.codec.ChainPolicy`` (the store's configuration names it) costs no zstd and no encoder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckpt._lazy import lazy_names

from .errors import (
    ChainLinkError,
    ChecksumError,
    CodecError,
    DecodeError,
    EncodeError,
    FieldMaskError,
    MaskedStateError,
    MergeTooLargeError,
    OutputTooLargeError,
    PrefixFrameError,
    StateTooLargeError,
    TruncatedFrameError,
    UnsupportedFormatError,
    WireFormatError,
)
from .policy import DEFAULT_POLICY, ChainPolicy

if TYPE_CHECKING:
    from .chainreader import ChainReader, open_chain
    from .chainstats import ChainStats
    from .compaction import compact
    from .decoder import DecodedVersion, decode, decode_latest, decode_sealed, iter_versions
    from .encoded import EncodedFrame, StateSnapshot
    from .encoder import ChainEncoder
    from .fieldmask import FieldMask, compile_mask
    from .frame import (
        FORMAT_VERSION,
        MAX_STATE_SIZE,
        READABLE_FORMATS,
        FrameHeader,
        FrameKind,
        frame_kind,
        pack,
        parse,
        state_checksum,
    )
    from .keyframes import keyframe
    from .prefix import prefix_frame, prefix_state, sealed_prefix
    from .wire import check_patch, count_fields, field_spans
    from .wirestrings import invalid_utf8_field

__all__ = [
    "DEFAULT_POLICY",
    "FORMAT_VERSION",
    "MAX_STATE_SIZE",
    "READABLE_FORMATS",
    "ChainEncoder",
    "ChainLinkError",
    "ChainPolicy",
    "ChainReader",
    "ChainStats",
    "ChecksumError",
    "CodecError",
    "DecodeError",
    "DecodedVersion",
    "EncodeError",
    "EncodedFrame",
    "FieldMask",
    "FieldMaskError",
    "FrameHeader",
    "FrameKind",
    "MaskedStateError",
    "MergeTooLargeError",
    "OutputTooLargeError",
    "PrefixFrameError",
    "StateSnapshot",
    "StateTooLargeError",
    "TruncatedFrameError",
    "UnsupportedFormatError",
    "WireFormatError",
    "check_patch",
    "compact",
    "compile_mask",
    "count_fields",
    "decode",
    "decode_latest",
    "decode_sealed",
    "field_spans",
    "frame_kind",
    "invalid_utf8_field",
    "iter_versions",
    "keyframe",
    "open_chain",
    "pack",
    "parse",
    "prefix_frame",
    "prefix_state",
    "sealed_prefix",
    "state_checksum",
]

#: The module each name of __all__ not imported above comes from.
_HOMES = {
    **dict.fromkeys(("ChainReader", "open_chain"), ".chainreader"),
    **dict.fromkeys(("compact",), ".compaction"),
    **dict.fromkeys(("DecodedVersion", "decode", "decode_latest", "decode_sealed", "iter_versions"), ".decoder"),
    **dict.fromkeys(("ChainStats",), ".chainstats"),
    **dict.fromkeys(("ChainEncoder",), ".encoder"),
    **dict.fromkeys(("EncodedFrame", "StateSnapshot"), ".encoded"),
    **dict.fromkeys(("keyframe",), ".keyframes"),
    **dict.fromkeys(("FieldMask", "compile_mask"), ".fieldmask"),
    **dict.fromkeys(("prefix_frame", "prefix_state", "sealed_prefix"), ".prefix"),
    **dict.fromkeys(
        (
            "FORMAT_VERSION",
            "MAX_STATE_SIZE",
            "READABLE_FORMATS",
            "FrameHeader",
            "FrameKind",
            "frame_kind",
            "pack",
            "parse",
            "state_checksum",
        ),
        ".frame",
    ),
    **dict.fromkeys(("check_patch", "count_fields", "field_spans"), ".wire"),
    **dict.fromkeys(("invalid_utf8_field",), ".wirestrings"),
}


__getattr__, __dir__ = lazy_names(__name__, _HOMES)
