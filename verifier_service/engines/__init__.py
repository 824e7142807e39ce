"""The engine contract (decode_loop) and the two engines behind it: transformers and vLLM."""
