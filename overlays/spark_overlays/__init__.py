"""spark_overlays: placeholder, filled in below."""

def register() -> None:  # replaced by the real plugin entry
    return None
