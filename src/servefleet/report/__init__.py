"""Reports: pure functions of request records (tables, JSON, HTML, comparisons)."""
