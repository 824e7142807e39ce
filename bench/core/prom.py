"""Read Prometheus histograms (sum and count) from a service's /metrics page."""

from __future__ import annotations

from devkit.stack import parse_metrics, scrape_metrics


def by_name(samples: dict[tuple[str, tuple], float]) -> dict[str, float]:
    """Samples by name, labelled ones summed over their labels; histogram buckets left out."""
    values: dict[str, float] = {}
    for (name, labels), value in samples.items():
        if not any(key == "le" for key, _ in labels):
            values[name] = values.get(name, 0.0) + value
    return values


def parse(text: str) -> dict[str, float]:
    return by_name(parse_metrics(text))


def scrape(port: int, timeout_s: float = 5.0) -> dict[str, float]:
    return by_name(scrape_metrics(port, timeout_s))


HISTOGRAMS = ("specdec_verify_forward_seconds", "specdec_draft_wait_seconds")


def histogram_delta(before: dict[str, float], after: dict[str, float], name: str) -> tuple[float, float]:
    """(sum, count) observed between two scrapes."""
    return (after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0),
            after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0))
