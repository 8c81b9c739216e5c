"""Generated protobuf/gRPC stubs for proto/ckpt/v1 (do not edit; see scripts/gen_stubs.py)."""
