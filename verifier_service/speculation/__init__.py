"""One request's speculation: its round record and statistics, the k policy, the accept/reject rules."""
