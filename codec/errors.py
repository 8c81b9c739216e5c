"""The codec's one error hierarchy.

    CodecError
    ├── EncodeError            producing a frame failed (bad input to the encoder)
    │   ├── WireFormatError    a MERGE patch is not well-formed protobuf wire format
    │   └── MergeTooLargeError a MERGE's state beyond the caller's max_state_size
    ├── FieldMaskError         a field mask names no field of the message type (fieldmask.py)
    ├── MaskedStateError       a state's fields a mask's path goes into do not parse as its type
    └── DecodeError            reading frames failed; no bytes are returned
        ├── TruncatedFrameError    fewer bytes than the header says
        ├── UnsupportedFormatError magic or format version not understood
        ├── ChecksumError          a header, payload or state checksum mismatch
        ├── ChainLinkError         a frame applied to the wrong base / out of order
        │   └── PrefixFrameError   a PREFIX frame given to a chain's reader (it belongs to no chain)
        ├── StateTooLargeError     a state beyond the caller's max_state_bytes
        └── OutputTooLargeError    a decode materialising more than the caller's max_output_bytes

Messages name the version, offsets and sizes involved. Misuse of the API
(wrong argument types, out-of-range configuration, no frames to decode)
raises TypeError or ValueError instead, as the standard library does.
"""

from __future__ import annotations


class CodecError(Exception):
    """Root of every error the codec raises for bad data."""


class EncodeError(CodecError):
    """A frame could not be produced from the given input."""


class WireFormatError(EncodeError):
    """A MERGE patch is not well-formed protobuf wire format."""

    def __init__(self, message: str, *, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


class MergeTooLargeError(EncodeError):
    """A MERGE would make a state larger than the caller's ``max_state_size``, counted without the fields
    its patch overwrites when the encoder compacts (``state_size``); nothing changed."""

    def __init__(self, message: str, *, version: int, state_size: int, limit: int) -> None:
        super().__init__(message)
        self.version = version
        self.state_size = state_size
        self.limit = limit


class FieldMaskError(CodecError):
    """A field mask's path is malformed, or names a field its message type does not have."""


class MaskedStateError(CodecError):
    """The fields of a state a field mask's path goes into (``handoff`` of ``handoff.next``) do not parse as
    the state's message type: the state is not what its type says (fieldmask.py)."""


class DecodeError(CodecError):
    """Frames could not be decoded; nothing was returned."""


class TruncatedFrameError(DecodeError):
    """The input ends before the frame it starts is complete."""


class UnsupportedFormatError(DecodeError):
    """The frame's magic or format version is not one this codec reads."""


class ChecksumError(DecodeError):
    """A checksum does not match: the frame or the state it decodes to is corrupt."""


class ChainLinkError(DecodeError):
    """A frame does not follow the frame before it (wrong base, order or stream)."""


class PrefixFrameError(ChainLinkError):
    """A chain's reader met a PREFIX frame: its state is a prefix of a newer version's state, read with
    prefix_state() from that version's state, never from a chain."""

    def __init__(self, message: str, *, version: int, source_version: int, state_size: int) -> None:
        super().__init__(message)
        self.version = version
        self.source_version = source_version
        self.state_size = state_size


class StateTooLargeError(DecodeError):
    """A frame declares a state larger than the caller's ``max_state_bytes``; nothing was decompressed for it."""

    def __init__(self, message: str, *, version: int, state_size: int, limit: int) -> None:
        super().__init__(message)
        self.version = version
        self.state_size = state_size
        self.limit = limit


class OutputTooLargeError(DecodeError):
    """Decoding the frames would materialise more bytes than the caller's ``max_output_bytes`` (a FULL frame's
    state, each PATCH's patch, each DELTA's whole state); nothing was decompressed. The frames may be sound:
    it bounds the work, not the data."""

    def __init__(self, message: str, *, version: int, output_bytes: int, limit: int) -> None:
        super().__init__(message)
        self.version = version
        self.output_bytes = output_bytes
        self.limit = limit
