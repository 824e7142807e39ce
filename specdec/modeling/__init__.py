"""Models: loading (and fetching) them, their KV caches, prepacked linears, grouped-head attention."""
