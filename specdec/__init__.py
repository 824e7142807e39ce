"""Shared code of the specdec services: runtime/ (start-up, config, calls, metrics), modeling/ (models and caches),
decoding/ (sampling, the speedup model, detokenizing, the draft block), v1/ (generated wire code)."""
