"""The verifier service: the target model, one KV cache per sequence, and the draft/verify rounds."""
