"""The gateway: the public API (specdec.v1.Gateway). It tokenizes, calls the verifier, and detokenizes."""
