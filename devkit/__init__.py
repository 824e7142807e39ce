"""For tests, benchmarks and `make run` (not shipped): start the three services, build tiny seeded models."""
