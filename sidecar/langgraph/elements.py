"""How a list channel's elements are serialized, stored and told apart. No I/O.

A step stores a list's elements from the first one that differs from the head's, found by comparing
digests of serialized elements. LangGraph's ``EncryptedSerializer`` makes each serialization a new
ciphertext (a random nonce): digests of what is stored would never match, and every step would store the
whole list again, encrypted and so incompressible (a 200-message thread: 65x the bytes). Under it the digests
are of the plaintext, the wrapped serializer's bytes, and only the elements a step writes are encrypted.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import xxhash
from langgraph.checkpoint.serde.base import CipherProtocol, SerializerProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from .msgpacksplit import MsgpackSplitError, split_array

#: An element's digest: its serializer's type name and the XXH3-128 of its (plaintext) bytes.
Digest = tuple[str, int]
#: An element as a serializer gives it: its type's name and bytes.
Pair = tuple[str, bytes]

xxh3_128 = xxhash.xxh3_128_intdigest


def digest(type_: str, data: bytes) -> Digest:
    return type_, xxh3_128(data)


def msgpack_array_header(count: int) -> bytes:
    """The header of a msgpack array of ``count`` values: what precedes their bytes in the array's."""
    if count < 16:
        return bytes((0x90 | count,))
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


class Elements:
    """A saver's serializer (``serde``) as list elements need it: ``dumps`` gives the bytes digests are of,
    ``seal`` what is stored of them, ``stored_digest`` the digest of an element read back."""

    __slots__ = ("_cipher", "_plain", "_whole", "serde")

    def __init__(self, serde: SerializerProtocol) -> None:
        self.serde = serde
        self._plain: SerializerProtocol = serde
        self._cipher: CipherProtocol | None = None
        # A msgpack array's bytes are its header and its values' own, so JsonPlusSerializer's bytes of a
        # list hold those of each element as dumps makes them (see dumps_after).
        self._whole = type(serde).dumps_typed is JsonPlusSerializer.dumps_typed
        # Not a subclass's: it may store another format than the one seal makes (and loads_typed reads).
        if type(serde) is EncryptedSerializer:
            self._plain, self._cipher = serde.serde, serde.cipher

    @property
    def encrypts(self) -> bool:
        return self._cipher is not None

    def dumps(self, values: list[Any]) -> list[Pair]:
        """Each element serialized (unencrypted; a bytearray as bytes: msgpack has none, and InMemorySaver
        and PostgresSaver give it back as bytes), in one loop: a step serializes them all. A list one of
        whose elements JsonPlusSerializer pickles (``pickle_fallback``): each element pickled."""
        dumps = self._plain.dumps_typed
        out: list[Pair] = []
        for value in values:
            type_, data = dumps(bytes(value) if isinstance(value, bytearray) else value)
            out.append((type_, data if type(data) is bytes else bytes(data)))
            if type_ == "pickle" and isinstance(self._plain, JsonPlusSerializer) and self._plain.pickle_fallback:
                # Its pickle_fallback pickles a list msgpack cannot hold whole, so that it reads back as it was
                # (a tuple a tuple, a bytearray a bytearray, where msgpack gives a list and bytes): each
                # element pickled reads back so too.
                return [("pickle", pickle.dumps(value)) for value in values]
        return out

    def dumps_after(self, values: list[Any], known: Sequence[Pair]) -> list[Pair] | None:
        """``dumps(values)`` for a list as long as ``known`` (elements as ``dumps`` gave them, the head's) or
        longer, with the list serialized in one call and only the elements after ``known`` one by one: ~15%
        less than ``dumps`` for an appended conversation. Elements the list's bytes show unchanged are
        ``known``'s own pairs; when they show one changed (a node edited it in place), each of the first
        ``len(known)`` is cut out of those bytes (msgpacksplit.py). None unless every element is msgpack
        (not None, bytes, a pickle) and the list's bytes end with the added elements': ``dumps`` then
        serializes each."""
        start = len(known)
        if not self._whole or start < 2 or len(values) < start:
            return None
        packed = [data for type_, data in known if type_ == "msgpack"]
        tail = self.dumps(values[start:])
        if len(packed) < start or any(type_ != "msgpack" for type_, _ in tail):
            return None
        try:
            type_, whole = self.serde.dumps_typed(values)
        except TypeError:
            # msgpack's depth limit counts the list's own level: an element nested just under it is
            # serialized alone (dumps) but not inside the list.
            return None
        added = [data for _, data in tail]
        prefix, rest = b"".join(packed), b"".join(added)
        offset = len(msgpack_array_header(len(values)))
        if type_ != "msgpack" or not whole.endswith(rest):
            return None
        if len(whole) == offset + len(prefix) + len(rest) and whole.startswith(prefix, offset):
            return [*known, *tail]
        # The elements the head held changed (one edited in place, replaced, or the list cut and grown):
        # the list's bytes hold each element's, cut apart rather than serialized again. Not for None or
        # bytes, which dumps gives as types of their own.
        if any(v is None or isinstance(v, (bytes, bytearray)) for v in values[:start]):
            return None
        try:
            held = split_array(whole)
        except MsgpackSplitError:
            return None
        if len(held) != len(values) or held[start:] != added:
            return None
        return [*(("msgpack", data) for data in held[:start]), *tail]

    def seal(self, pairs: Sequence[Pair]) -> Sequence[Pair]:
        """What is stored of elements ``dumps`` gave: the same pairs, or encrypted as EncryptedSerializer
        encrypts (its type name then ends in "+" and the cipher's name), which it reads back."""
        cipher = self._cipher
        if cipher is None:
            return pairs
        out: list[Pair] = []
        for type_, data in pairs:
            name, sealed = cipher.encrypt(data)
            out.append((f"{type_}+{name}", sealed))
        return out

    def unseal(self, pairs: Sequence[Pair]) -> Sequence[Pair]:
        """Elements as ``dumps`` gave them, from what is stored of them (``seal``'s, or stored unencrypted)."""
        cipher = self._cipher
        if cipher is None:
            return pairs
        out: list[Pair] = []
        for type_, data in pairs:
            if "+" in type_:
                type_, name = type_.split("+", 1)
                data = cipher.decrypt(name, data)
            out.append((type_, data))
        return out

    def stored_digest(self, type_: str, data: bytes) -> Digest:
        """The digest of an element as stored: that of its plaintext, as ``dumps`` gave it. Under a cipher, an
        element stored unencrypted (before the serializer encrypted) matches none, so that the next step
        writes it again, encrypted."""
        if self._cipher is None:
            return type_, xxh3_128(data)
        if "+" not in type_:
            return type_, _MATCHES_NONE
        plain_type, name = type_.split("+", 1)
        return plain_type, xxh3_128(self._cipher.decrypt(name, data))

    def stored_digests(self, pairs: Sequence[Pair]) -> StoredDigests:
        return StoredDigests(pairs, self.stored_digest)


#: Not an XXH3-128 (those are >= 0).
_MATCHES_NONE = -1


class StoredDigests(Sequence[Digest]):
    """The digests of a list's elements as stored, taken when first asked for: a head read that no put
    continues does not hash (or decrypt) its elements, and its length needs none of them."""

    __slots__ = ("_digests", "_of", "_pairs")

    def __init__(self, pairs: Sequence[Pair], of: Callable[[str, bytes], Digest]) -> None:
        self._pairs = pairs
        self._of = of
        self._digests: list[Digest] | None = None

    def _all(self) -> list[Digest]:
        if self._digests is None:
            of = self._of
            self._digests = [of(t, d) for t, d in self._pairs]
        return self._digests

    def __len__(self) -> int:
        return len(self._pairs)

    @overload
    def __getitem__(self, index: int) -> Digest: ...
    @overload
    def __getitem__(self, index: slice) -> list[Digest]: ...
    def __getitem__(self, index: int | slice) -> Digest | list[Digest]:
        return self._all()[index]

    def __iter__(self) -> Iterator[Digest]:
        return iter(self._all())
