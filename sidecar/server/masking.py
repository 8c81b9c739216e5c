"""Field-masked Gets (GetRequest.field_mask), whichever process reads the state: the store process, or the
gRPC process from a whole state's reply it keeps or reads itself.

The mask is applied to the whole state read (codec/fieldmask.py: top-level
fields kept as their bytes, only what a nested path needs parsed); the reply
carries the masked state, the version's info and its message type. A mask on
a version with no message type, a malformed path or a field the type does not
have is INVALID_ARGUMENT naming it; a state whose fields a path goes into do
not parse as its type is DATA_LOSS naming the field.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from google.protobuf.message import DecodeError, Message

from ckpt.v1 import service_pb2

from ...codec import FieldMask, FieldMaskError, MaskedStateError, WireFormatError, compile_mask
from ...codec.fieldmask import check_paths
from ..errors import DataLoss, FailedPrecondition, InvalidArgument
from ..store import GetResult, Store

#: The largest state a masked Get masks on the store process's event loop; a larger one is masked on a thread.
INLINE_MASK_MAX_STATE_BYTES = 256 * 1024
# Compiled masks kept (per message class and paths): an agent fleet asks for a few masks, over and over.
_MASKS_KEPT = 256


def mask_paths(request: service_pb2.GetRequest) -> tuple[str, ...]:
    """The request's mask paths (empty: the whole state), refused before anything is read if malformed."""
    paths = request.field_mask.paths
    if not paths:
        return ()
    try:
        return check_paths(paths)
    except FieldMaskError as exc:
        raise InvalidArgument(str(exc)) from None


class Masks:
    """Masks compiled against ``store``'s message types, kept for reuse; thread-safe."""

    def __init__(self, store: Store) -> None:
        self._store = store
        #: By type name and paths; a mask holds its class, and the class its registration's descriptor pool.
        self._compiled: dict[tuple[str, tuple[str, ...]], FieldMask] = {}
        self._lock = threading.Lock()

    def masked(self, session_id: str, got: GetResult, paths: Sequence[str]) -> GetResult:
        """``got`` with its state masked to ``paths``; InvalidArgument for a version with no message type or
        a path its type does not have."""
        mask = self._mask(session_id, got, tuple(paths))
        try:
            state = mask.apply(got.state)
        except WireFormatError as exc:  # a typed write parsed when it was stored: this is damage
            raise DataLoss(
                f"session {session_id!r} version {got.version}: its {got.info.message_type} state is not"
                f" well-formed wire format: {exc}"
            ) from None
        except MaskedStateError as exc:  # it parsed as its type when it was stored: this is damage too
            raise DataLoss(
                f"session {session_id!r} version {got.version}: its state does not parse as its type: {exc}"
            ) from None
        return GetResult(got.version, state, got.info)

    def masked_reply(self, body: bytes, paths: Sequence[str]) -> tuple[bytes, int] | None:
        """The masked reply made from a whole state's GetResponse ``body``, and its state's size; None if
        this process cannot say (the store process then answers, with its error if there is one)."""
        try:
            response = service_pb2.GetResponse.FromString(body)
        except DecodeError:
            return None
        state = self.try_masked(response.message_type, response.state, paths)
        if state is None:
            return None
        response.state = state
        return bytes(response.SerializeToString()), len(state)

    def try_masked(self, message_type: str, state: bytes, paths: Sequence[str]) -> bytes | None:
        """``state`` of ``message_type`` masked to ``paths`` by the store's registry as it is (the caller
        reloads it: Store.types_generation); None if this process cannot say (no type, a path it does not
        know)."""
        if not message_type:
            return None
        cls = self._store.message_class(message_type)
        if cls is None:
            return None
        try:
            return self._compile(cls, tuple(paths)).apply(state)
        except (FieldMaskError, WireFormatError, MaskedStateError):
            return None

    def _mask(self, session_id: str, got: GetResult, paths: tuple[str, ...]) -> FieldMask:
        name = got.info.message_type
        if not name:
            raise InvalidArgument(
                f"field_mask: session {session_id!r} version {got.version} has no message type (opaque bytes):"
                " a mask needs a session written typed (PutRequest.message_type, after RegisterType)"
            )
        # Another process (a worker) may have changed the type since this one loaded it: a field renamed
        # is masked by its new name only. Alone on its store, this process's registry is current.
        cls = self._store.current_message_class(name)
        if cls is None:
            raise FailedPrecondition(f"session {session_id!r} is typed {name!r}, which is not registered")
        try:
            return self._compile(cls, paths)
        except FieldMaskError as exc:
            raise InvalidArgument(f"{exc} (session {session_id!r})") from None

    def _compile(self, cls: type[Message], paths: tuple[str, ...]) -> FieldMask:
        name = cls.DESCRIPTOR.full_name
        key = (name, paths)
        mask = self._compiled.get(key)
        if mask is not None and mask.message_type is cls:
            return mask
        mask = compile_mask(cls, paths)
        with self._lock:
            # The type may have been registered again: the masks of its earlier class go, and with them that
            # registration's descriptor pool (~250 KB each), which they alone would keep alive.
            for stale in [k for k, kept in self._compiled.items() if k[0] == name and kept.message_type is not cls]:
                del self._compiled[stale]
            if len(self._compiled) >= _MASKS_KEPT:
                self._compiled.clear()
            self._compiled[key] = mask
        return mask
