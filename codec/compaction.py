"""Canonical re-serialization of states built by MERGE.

A MERGE chain's state is the concatenation of every patch; fields a later
patch overwrote (singular scalars, map entries) stay in the bytes. Parsing and
re-serializing with the schema drops them. The *message* is unchanged (parsing
either encoding gives equal messages); only the bytes differ.
"""

from __future__ import annotations

from google.protobuf import message as _message

from .errors import EncodeError


def compact(state: bytes, message_type: type[_message.Message]) -> bytes:
    """Return the canonical (deterministic) encoding of ``state`` as ``message_type``."""
    try:
        msg = message_type.FromString(state)
    except _message.DecodeError as exc:
        raise EncodeError(
            f"cannot compact a {len(state)}-byte state: it does not parse as"
            f" {message_type.DESCRIPTOR.full_name} ({exc})"
        ) from None
    # Partial: a state built from MERGE patches may lack a proto2 message's
    # required fields; re-serializing must keep it as it is, not validate it.
    return msg.SerializePartialToString(deterministic=True)
