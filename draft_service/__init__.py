"""The draft service: proposers (a small causal LM, or n-gram prompt lookup) behind one gRPC stream."""
