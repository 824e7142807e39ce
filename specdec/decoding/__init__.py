"""Decoding arithmetic shared by the services: sampling, the speedup model, detokenizing, the draft block."""
