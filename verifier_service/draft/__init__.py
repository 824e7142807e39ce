"""The verifier's side of the draft service: the link, one session per sequence, the Propose stream."""
