"""Shared code of the specdec services: wire types, sampling, tokenizers, telemetry, config."""
