"""Canonical re-serialization of states built by MERGE.

A MERGE chain's state is the concatenation of every patch; fields a later
patch overwrote (singular scalars, map entries) stay in the bytes. Parsing and
re-serializing with the schema drops them. The *message* is unchanged (parsing
either encoding gives equal messages); only the bytes differ.

A state holding unknown fields (anywhere, nested messages included: a field
number, a closed-enum value or a wire type the schema does not know yet) is
left as it is. Re-serializing moves unknown fields after the known ones, so
their order against the known occurrences of the same field or oneof would be
lost: once a compatible re-registration adds the field or the value, the
re-serialized state would parse differently from the concatenation (an
unknown oneof member written before a known one would win).
"""

from __future__ import annotations

from google.protobuf import message as _message

from .errors import EncodeError


def compact(state: bytes, message_type: type[_message.Message]) -> bytes:
    """Return the canonical (deterministic) encoding of ``state`` as ``message_type``, or ``state`` itself
    when it holds unknown fields."""
    try:
        msg = message_type.FromString(state)
    except _message.DecodeError as exc:
        raise EncodeError(
            f"cannot compact a {len(state)}-byte state: it does not parse as"
            f" {message_type.DESCRIPTOR.full_name} ({exc})"
        ) from None
    # Partial: a state built from MERGE patches may lack a proto2 message's
    # required fields; re-serializing must keep it as it is, not validate it.
    canonical = msg.SerializePartialToString(deterministic=True)
    # Every unknown field takes at least its tag's byte, so discarding them
    # (recursively) shrinks the encoding exactly when there are some. Not
    # ByteSize(): it refuses a message missing required fields.
    msg.DiscardUnknownFields()
    if len(msg.SerializePartialToString()) != len(canonical):
        return state
    return canonical
