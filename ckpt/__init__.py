"""ckpt: the one import namespace of the ckpt-sidecar distribution.

``ckpt.codec``, ``ckpt.sidecar`` and ``ckpt.bench`` are the repository's codec/, sidecar/ and bench/
folders (linked here, copied into the wheel); ``ckpt.v1`` and ``ckpt.store.v1`` are the stubs generated
from proto/ (scripts/gen_stubs.py).
"""
