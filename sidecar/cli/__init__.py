"""The `ckpt` command line."""
