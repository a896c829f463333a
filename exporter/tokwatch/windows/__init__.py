"""Window figures: which runs a window takes, and the medians, spreads and percentiles over them."""
