"""Read Prometheus histograms (sum and count) from a service's /metrics page."""

from __future__ import annotations

import re
import urllib.request

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)$")


def parse(text: str) -> dict[str, float]:
    """Unlabelled samples by name (labelled ones are summed over their labels)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line.strip())
        if match and not (match.group(2) and "le=" in match.group(2)):
            values[match.group(1)] = values.get(match.group(1), 0.0) + float(match.group(3))
    return values


def scrape(port: int, timeout_s: float = 5.0) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as reply:
        return parse(reply.read().decode())


HISTOGRAMS = ("specdec_verify_forward_seconds", "specdec_draft_wait_seconds")


def histogram_delta(before: dict[str, float], after: dict[str, float], name: str) -> tuple[float, float]:
    """(sum, count) observed between two scrapes."""
    return (after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0),
            after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0))
